#include "checkpoint/pickle.h"

#include <ATen/core/Dict.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "gpurun/errors.h"

namespace gpurun {

std::string pickle_tensors(const NamedTensors& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor);
  // torch::jit::pickle_save() with one difference: no type tags. A tagged dict is pickled as a
  // call to torch.jit._pickle.restore_type_tag, which torch.load's default weights_only=True
  // (PyTorch >= 2.6) refuses; untagged, the file holds only a dict, strings and tensors.
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) { pickled.insert(pickled.end(), data, data + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    archive.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return archive;
}

NamedTensors unpickle_tensors(std::shared_ptr<caffe2::serialize::ReadAdapterInterface> reader,
                              const std::string& what) {
  c10::IValue value;
  try {
    caffe2::serialize::PyTorchStreamReader archive(std::move(reader));
    value = torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                              std::nullopt, std::nullopt, std::nullopt, archive);
  } catch (const std::exception& e) {
    throw DamagedCheckpointError(what + " is not a pickled tensor dict: " + e.what());
  }
  if (!value.isGenericDict()) throw DamagedCheckpointError(what + " is not a pickled tensor dict");
  NamedTensors out;
  for (const auto& entry : value.toGenericDict())
    out.emplace_back(entry.key().toStringRef(), entry.value().toTensor());
  return out;
}

NamedTensors unpickle_tensors(const std::string& bytes, const std::string& what) {
  return unpickle_tensors(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), bytes.size()), what);
}

}  // namespace gpurun

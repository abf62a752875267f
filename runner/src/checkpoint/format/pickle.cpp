#include "checkpoint/format/pickle.h"

#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <string_view>
#include <unordered_map>

#include "checkpoint/format/pickle_check.h"
#include "gpurun/errors.h"

namespace gpurun {

namespace {

/// The dtypes of weights, buffers and generator states: those a resume can copy into a model
/// (at::Tensor::copy_). A pickle may name any storage type, also ones copy_() has no kernel
/// for (UInt7, the bit and quantized types), whose c10::Error would name neither file nor
/// tensor, and would not let the resume fall back to the previous checkpoint.
bool loadable(at::ScalarType type) {
  switch (type) {
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kHalf:
    case at::kFloat:
    case at::kDouble:
    case at::kBFloat16:
    case at::kBool:
    case at::kComplexFloat:
    case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

/// Empty when every element of `t` lies inside the `storage_bytes` its storage really holds;
/// else why not. The sizes, strides and offset come from the pickle, and so does the size the
/// storage claims (its element count); the bytes behind it are the archive's record. A damaged
/// file may make them disagree, and a copy would then read past the record.
std::string outside_storage(const at::Tensor& t, size_t storage_bytes) {
  if (t.numel() == 0) return "";
  // Element offsets of the first and last element, without overflow (__int128 holds any sum
  // of products of two int64 values over a tensor's dimensions).
  __int128 lo = t.storage_offset(), hi = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    const __int128 span = static_cast<__int128>(t.size(d) - 1) * t.stride(d);
    (span < 0 ? lo : hi) += span;
  }
  const __int128 needed = (hi + 1) * static_cast<__int128>(t.element_size());
  if (lo >= 0 && needed <= static_cast<__int128>(storage_bytes)) return "";
  return "sizes " + c10::str(t.sizes()) + ", strides " + c10::str(t.strides()) + " and offset " +
         std::to_string(t.storage_offset()) + " reach outside its storage of " +
         std::to_string(storage_bytes) + " bytes";
}

}  // namespace

void write_archive(
    const ByteSink& out,
    const std::function<void(const ArchiveWriterFunction& writer, const bool& failed)>& write) {
  // LibTorch calls the writer function from inside miniz (C), and a PyTorchStreamWriter that
  // once saw a short write throws again from its destructor (its writeEndOfFile), which
  // std::terminate()s an unwinding process. So the writer never learns of the failure: the rest
  // of the archive is discarded, and the sink's exception rethrown once the writer is done.
  std::exception_ptr error;
  bool failed = false;
  const ArchiveWriterFunction writer = [&](const void* data, size_t size) -> size_t {
    if (failed) return size;
    try {
      out(static_cast<const char*>(data), size);
    } catch (...) {
      error = std::current_exception();
      failed = true;
    }
    return size;
  };
  write(writer, failed);
  if (failed) std::rethrow_exception(error);
}

void pickle_tensors(const NamedTensors& tensors, const ByteSink& out) {
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
  write_archive(out, [&](const ArchiveWriterFunction& writer, const bool& failed) {
    caffe2::serialize::PyTorchStreamWriter archive(writer);
    // torch::jit::writeArchiveAndTensors(), but for the stop after a failed write: the records
    // data/0, data/1, ... each written from the tensor's own storage
    // (getWriteableTensorData() copies only a device's tensor), then data.pkl.
    size_t i = 0;
    for (const at::Tensor& tensor : pickler.tensorData()) {
      if (failed) break;
      const torch::jit::WriteableTensorData record = torch::jit::getWriteableTensorData(tensor);
      archive.writeRecord("data/" + std::to_string(i++), record.data(), record.sizeInBytes());
    }
    if (!failed) archive.writeRecord("data.pkl", pickled.data(), pickled.size());
    archive.writeEndOfFile();
  });
}

std::string pickle_tensors(const NamedTensors& tensors) {
  std::string archive;
  pickle_tensors(tensors, [&](const char* data, size_t size) { archive.append(data, size); });
  return archive;
}

NamedTensors unpickle_tensors(std::shared_ptr<caffe2::serialize::ReadAdapterInterface> reader,
                              const std::string& what) {
  c10::IValue value;
  std::string problem;
  // The bytes each storage's record really holds, by its data pointer: LibTorch's unpickler
  // sizes a storage by the element count the pickle names, over whatever its record holds.
  std::unordered_map<const void*, size_t> record_bytes;
  try {
    caffe2::serialize::PyTorchStreamReader archive(std::move(reader));
    if (!archive.hasRecord("data.pkl")) {
      problem = "it has no data.pkl";
    } else {
      const auto [pickle, size] = archive.getRecord("data.pkl");
      const char* bytes = static_cast<const char*>(pickle.get());
      problem = pickle_problem(bytes, size);
      // A Python state_dict's pickle is rewritten: see without_ordered_dicts().
      const std::string data =
          problem.empty() && std::string_view(bytes, size).find("collections\nOrderedDict\n") !=
                                 std::string_view::npos
              ? without_ordered_dicts(std::string(bytes, size))
              : std::string(bytes, size);
      if (problem.empty()) {
        // torch::jit::readArchiveAndTensors() but for the record sizes kept.
        size_t offset = 0;
        torch::jit::Unpickler unpickler(
            [&](char* buf, size_t n) {
              const size_t count = std::min(n, data.size() - offset);
              if (count > 0) std::memcpy(buf, data.data() + offset, count);
              offset += count;
              return count;
            },
            /*type_resolver=*/nullptr, /*obj_loader=*/nullptr,
            [&](const std::string& name) {
              auto [record, record_size] = archive.getRecord("data/" + name);
              record_bytes[record.get()] = record_size;
              return std::move(record);
            },
            std::nullopt);
        unpickler.set_version(archive.version());
        value = unpickler.parse_ivalue();
      }
    }
  } catch (const c10::OutOfMemoryError&) {
    throw;  // the memory limit, not damage: the memory probe and the trainer handle it
  } catch (const c10::Error& e) {  // LibTorch's own: without its C++ backtrace
    throw DamagedCheckpointError(what +
                                 " is not a pickled tensor dict: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw DamagedCheckpointError(what + " is not a pickled tensor dict: " + e.what());
  }
  if (!problem.empty())
    throw DamagedCheckpointError(what + " is not a pickled tensor dict: " + problem);
  if (!value.isGenericDict()) throw DamagedCheckpointError(what + " is not a pickled tensor dict");
  NamedTensors out;
  for (const auto& entry : value.toGenericDict()) {
    // toStringRef() and toTensor() of anything else would throw c10::Error, which names
    // neither the file nor the entry.
    if (!entry.key().isString())
      throw DamagedCheckpointError(what + " is not a pickled tensor dict: a key is a " +
                                   entry.key().tagKind() + ", not a string");
    if (!entry.value().isTensor())
      throw DamagedCheckpointError(what +
                                   " is not a pickled tensor dict: " + entry.key().toStringRef() +
                                   " is a " + entry.value().tagKind() + ", not a tensor");
    const at::Tensor tensor = entry.value().toTensor();
    if (!loadable(tensor.scalar_type()))
      throw DamagedCheckpointError(what + ": tensor " + entry.key().toStringRef() + " has dtype " +
                                   c10::toString(tensor.scalar_type()) +
                                   ", which no gpurun checkpoint holds");
    const auto record = record_bytes.find(tensor.storage().data());
    const size_t storage_bytes = record == record_bytes.end()
                                     ? tensor.storage().nbytes()
                                     : std::min<size_t>(tensor.storage().nbytes(), record->second);
    if (const std::string outside = outside_storage(tensor, storage_bytes); !outside.empty())
      throw DamagedCheckpointError(what + ": tensor " + entry.key().toStringRef() + ": " + outside);
    out.emplace_back(entry.key().toStringRef(), tensor);
  }
  return out;
}

size_t BytesReadAdapter::read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const {
  if (pos >= bytes_.size()) return 0;
  const size_t count = std::min<uint64_t>(n, bytes_.size() - pos);
  // A storage of zero bytes is read into a null buffer: memcpy must not see it, even for 0.
  if (count > 0) std::memcpy(buf, bytes_.data() + pos, count);
  return count;
}

NamedTensors unpickle_tensors(const std::string& bytes, const std::string& what) {
  return unpickle_tensors(std::make_shared<BytesReadAdapter>(bytes), what);
}

}  // namespace gpurun

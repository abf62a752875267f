#include "checkpoint/format/export_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <ATen/core/Dict.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <caffe2/serialize/file_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "checkpoint/format/shard_files.h"
#include "gpurun/errors.h"
#include "util/fd_io.h"
#include "util/fs.h"
#include "util/hash.h"

namespace gpurun {
namespace {

constexpr int64_t kChunkBytes = 8LL << 20;

/// One tensor of model.pt: its name, its metadata (a tensor whose storage is never read) and
/// where its record's bytes are in the file.
struct Entry {
  std::string name;
  at::Tensor meta;
  int64_t offset = 0, bytes = 0;
};

/// model.pt's tensors without their data: the pickle is decoded over storages that are never
/// read (one unique byte each, to tell them apart), and each record is located in the file.
std::vector<Entry> model_entries(const std::string& path) {
  std::vector<Entry> entries;
  try {
    caffe2::serialize::PyTorchStreamReader archive(
        std::make_shared<caffe2::serialize::FileAdapter>(path));
    const auto [pickle, size] = archive.getRecord("data.pkl");
    const char* bytes = static_cast<const char*>(pickle.get());
    size_t pos = 0;
    std::map<const void*, std::string> keys;
    torch::jit::Unpickler unpickler(
        [&](char* buf, size_t n) {
          const size_t count = std::min(n, size - pos);
          std::memcpy(buf, bytes + pos, count);
          pos += count;
          return count;
        },
        nullptr, nullptr,
        [&](const std::string& key) {
          char* marker = new char[1];
          keys[marker] = key;
          return at::DataPtr(
              marker, marker, [](void* p) { delete[] static_cast<char*>(p); }, c10::kCPU);
        },
        std::nullopt);
    unpickler.set_version(archive.version());
    const c10::IValue value = unpickler.parse_ivalue();
    if (!value.isGenericDict()) throw DamagedCheckpointError(path + " is not a dict of tensors");
    for (const auto& item : value.toGenericDict()) {
      if (!item.key().isString() || !item.value().isTensor())
        throw DamagedCheckpointError(path + " is not a dict of tensors");
      const at::Tensor t = item.value().toTensor();
      const std::string key = keys.at(t.storage().data());
      if (!t.is_contiguous() || t.storage_offset() != 0)
        throw DamagedCheckpointError(path + ": " + item.key().toStringRef() +
                                     " is not a whole contiguous storage");
      const int64_t record = static_cast<int64_t>(archive.getRecordSize("data/" + key));
      if (record < static_cast<int64_t>(t.nbytes()))
        throw DamagedCheckpointError(path + ": the record of " + item.key().toStringRef() +
                                     " is shorter than the tensor");
      entries.push_back({item.key().toStringRef(), t,
                         static_cast<int64_t>(archive.getRecordOffset("data/" + key)),
                         static_cast<int64_t>(t.nbytes())});
    }
  } catch (const c10::Error& e) {
    throw DamagedCheckpointError(path + " is not a state_dict: " + e.what_without_backtrace());
  }
  return entries;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void pread_exact(int fd, char* buf, int64_t n, int64_t pos, const std::string& path) {
  if (fs::pread_full(fd, buf, static_cast<size_t>(n), pos, path) != static_cast<size_t>(n))
    throw DamagedCheckpointError(path + ": shorter than its records say");
}

}  // namespace

struct CheckpointWeights::State {
  const LoadedCheckpoint& checkpoint;
  std::string model_path;
  std::vector<Entry> entries;
  std::optional<ShardReader> shards;
  Fd model;
  std::vector<bool> from_master;  ///< per entry: read from the shard files' fp32 master
  explicit State(const LoadedCheckpoint& c)
      : checkpoint(c), model_path(c.info.path + "/model.pt") {}
};

CheckpointWeights::CheckpointWeights(const LoadedCheckpoint& checkpoint)
    : state_(std::make_unique<State>(checkpoint)) {
  State& s = *state_;
  s.entries = model_entries(s.model_path);
  if (!checkpoint.meta.sharded_optimizer.is_null()) {
    s.shards.emplace(checkpoint);
    if (s.shards->index().state_index("master") < 0) s.shards.reset();  // fp32 weights in model.pt
  }
  s.model.fd = ::open(s.model_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (s.model.fd < 0) throw IoError("open", s.model_path, errno);
  for (const Entry& e : s.entries) {
    const ShardedParameter* master = s.shards ? s.shards->index().parameter(e.name) : nullptr;
    const bool from_master = master && master->shape == e.meta.sizes().vec();
    s.from_master.push_back(from_master);
    tensors_.push_back(
        {e.name, e.meta.sizes().vec(), from_master ? at::kFloat : e.meta.scalar_type()});
  }
}

CheckpointWeights::~CheckpointWeights() = default;

int64_t CheckpointWeights::find(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return static_cast<int64_t>(i);
  return -1;
}

at::Tensor CheckpointWeights::read(size_t i) {
  State& s = *state_;
  const Entry& e = s.entries.at(i);
  at::Tensor data = at::empty(tensors_[i].shape, at::TensorOptions().dtype(tensors_[i].dtype));
  if (s.from_master[i]) {
    const ShardedParameter* master = s.shards->index().parameter(e.name);
    s.shards->want(e.name, "master", {0, master->numel}, data.data_ptr<float>());
    s.shards->read(/*verify=*/false);
  } else {
    pread_exact(s.model.fd, static_cast<char*>(data.data_ptr()), e.bytes, e.offset, s.model_path);
  }
  return data;
}

void CheckpointWeights::verify() {
  State& s = *state_;
  Xxh3 digest;  // model_digest: every tensor's bytes in state_dict order
  std::unique_ptr<char[]> chunk(new char[kChunkBytes]);
  for (const Entry& e : s.entries)
    for (int64_t done = 0; done < e.bytes; done += kChunkBytes) {
      const int64_t n = std::min(kChunkBytes, e.bytes - done);
      pread_exact(s.model.fd, chunk.get(), n, e.offset + done, s.model_path);
      digest.update(chunk.get(), static_cast<size_t>(n));
    }
  if (digest.hex() != s.checkpoint.meta.model_digest)
    throw DamagedCheckpointError(s.model_path + " does not match the manifest's model_digest " +
                                 s.checkpoint.meta.model_digest + " (its tensors hash to " +
                                 digest.hex() + ")");
}

void export_fp32_state_dict(const LoadedCheckpoint& checkpoint, const std::string& to) {
  CheckpointWeights weights(checkpoint);
  weights.verify();
  const std::string tmp = to + ".tmp-export-" + std::to_string(::getpid());
  Fd out;
  out.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out.fd < 0) throw IoError("create", tmp, errno);
  try {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) -> size_t {
      fs::write_all(out.fd, static_cast<const char*>(data), n, tmp);
      return n;
    });
    // The pickle names each tensor's shape and dtype; its storage is never read, so a tensor
    // over a marker stands for it, and each record is written as its data is ready.
    static char marker = 0;
    c10::Dict<std::string, at::Tensor> dict;
    for (size_t i = 0; i < weights.tensors().size(); ++i) {
      at::Tensor data = weights.read(i);
      if (at::isFloatingType(data.scalar_type()) && data.scalar_type() != at::kFloat)
        data = data.to(at::kFloat);
      writer.writeRecord("data/" + std::to_string(i), data.data_ptr(), data.nbytes());
      dict.insert(
          weights.tensors()[i].name,
          at::from_blob(&marker, data.sizes(), at::TensorOptions().dtype(data.scalar_type())));
    }
    // As pickle_tensors() (checkpoint/pickle.cpp): no type tags, which weights_only refuses.
    std::vector<char> pickled;
    torch::jit::Pickler pickler(
        [&](const char* data, size_t size) { pickled.insert(pickled.end(), data, data + size); },
        nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
    pickler.protocol();
    pickler.pushIValue(c10::IValue(dict));
    pickler.stop();
    writer.writeRecord("data.pkl", pickled.data(), pickled.size());
    writer.writeEndOfFile();
    if (::fsync(out.fd) != 0) throw IoError("fsync", tmp, errno);
    fs::rename_durable(tmp, to);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

}  // namespace gpurun

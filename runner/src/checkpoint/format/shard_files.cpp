#include "checkpoint/format/shard_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

#include "checkpoint/format/folder.h"
#include "gpurun/errors.h"
#include "optim/flat_optimizer.h"
#include "util/faults.h"
#include "util/fd_io.h"
#include "util/fs.h"
#include "util/hash.h"

namespace gpurun {
namespace {

/// Bytes of one write(2) or pread(2): large enough to stream at the disk's speed, small enough
/// that a reader's buffer stays within export's 64 MiB of headroom.
constexpr int64_t kChunkBytes = 8LL << 20;

/// Shard writes started by this process, for the "shard_write" fault point.
std::atomic<int64_t> shard_writes{0};

/// An open file descriptor, closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

nlohmann::json ShardFileEntry::to_json() const {
  return {
      {"name", name}, {"bytes", bytes}, {"xxh3", xxh3}, {"error", error}, {"errno", error_number}};
}

ShardFileEntry ShardFileEntry::from_json(const nlohmann::json& j) {
  ShardFileEntry e;
  e.name = j.value("name", "");
  e.bytes = j.value("bytes", int64_t{0});
  e.xxh3 = j.value("xxh3", "");
  e.error = j.value("error", "");
  e.error_number = j.value("errno", 0);
  return e;
}

void HostShardCopy::copy(FlatOptimizer& optimizer, const std::string& optimizer_name) {
  const std::vector<std::pair<std::string, at::Tensor>> state = optimizer.state();
  std::vector<std::string> names;
  for (const auto& entry : state) names.push_back(entry.first);
  index_ = make_shard_index(optimizer.layout(), optimizer_name, names, optimizer.step_count());
  rank_ = optimizer.rank();
  buffers_.resize(state.size());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < state.size(); ++i) {
    const at::Tensor& live = state[i].second;
    at::Tensor& buffer = buffers_[i];
    if (!buffer.defined() || buffer.numel() != live.numel())
      buffer = at::empty({live.numel()},
                         at::TensorOptions().dtype(at::kFloat).pinned_memory(!live.is_cpu()));
    // Blocking: the file is written right after, on this thread.
    buffer.copy_(live.reshape({-1}));
  }
}

std::string HostShardCopy::file_name() const { return shard_file_name(rank_, index_.world_size); }

int64_t HostShardCopy::file_bytes() const {
  return static_cast<int64_t>(buffers_.size()) * index_.section_bytes();
}

ShardFileEntry HostShardCopy::write(const std::string& folder) const {
  ShardFileEntry entry;
  entry.name = file_name();
  const std::string path = checkpoint_folder::join(folder, entry.name);
  const int64_t attempt = ++shard_writes;
  fs::with_retries([&] {
    Fd file;
    file.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (file.fd < 0) throw IoError("create", path, errno);
    Xxh3 hash;
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const char* data = static_cast<const char*>(buffers_[i].data_ptr());
      const int64_t n = buffers_[i].numel() * 4;
      for (int64_t done = 0; done < n; done += kChunkBytes) {
        const int64_t w = std::min(kChunkBytes, n - done);
        hash.update(data + done, static_cast<size_t>(w));
        fs::write_all(file.fd, data + done, static_cast<size_t>(w), path);
      }
      // Test hook: a process killed here leaves a partial shard in the temporary folder.
      if (i == 0) fault_point("shard_write", attempt);
    }
    if (::fsync(file.fd) != 0) throw IoError("fsync", path, errno);
    entry.bytes = file_bytes();
    entry.xxh3 = hash.hex();
  });
  return entry;
}

std::string HostShardCopy::bytes() const {
  std::string out;
  out.reserve(static_cast<size_t>(file_bytes()));
  for (const at::Tensor& b : buffers_)
    out.append(static_cast<const char*>(b.data_ptr()), static_cast<size_t>(b.numel() * 4));
  return out;
}

ShardReader::ShardReader(const LoadedCheckpoint& checkpoint) : checkpoint_(checkpoint) {
  // meta, not info.manifest: the memory probe's checkpoint has no manifest.
  if (checkpoint.meta.sharded_optimizer.is_null())
    throw DamagedCheckpointError(checkpoint.info.path + ": its manifest has no " +
                                 kShardedOptimizerKey);
  try {
    index_ = ShardIndex::from_json(checkpoint.meta.sharded_optimizer);
  } catch (const std::invalid_argument& e) {
    throw DamagedCheckpointError(checkpoint.info.path + "/manifest.json: " + e.what());
  }
}

void ShardReader::want(const std::string& parameter, const std::string& state, ElementRange range,
                       float* dst) {
  const ShardedParameter* p = index_.parameter(parameter);
  if (!p) throw ResumeError(checkpoint_.info.path + " holds no optimizer state of " + parameter);
  const int64_t s = index_.state_index(state);
  if (s < 0)
    throw ResumeError(checkpoint_.info.path + " holds no optimizer state " + state +
                      " (it holds the states of a run of optim.name " + index_.optimizer + ")");
  if (range.begin < 0 || range.end > p->numel)
    throw ResumeError(checkpoint_.info.path + ": " + parameter + " has " +
                      std::to_string(p->numel) + " elements in the checkpoint");
  int64_t covered = 0;
  for (const ShardChunk& c : p->chunks) {
    const ElementRange x = c.range.intersect(range);
    if (x.empty()) continue;
    requests_[c.file].push_back(
        {c.byte_offset + s * index_.section_bytes() + (x.begin - c.range.begin) * 4, x.size() * 4,
         reinterpret_cast<char*>(dst + (x.begin - range.begin))});
    covered += x.size();
  }
  if (covered != range.size())
    throw DamagedCheckpointError(checkpoint_.info.path + ": the chunks of " + parameter +
                                 " do not hold its elements [" + std::to_string(range.begin) +
                                 ", " + std::to_string(range.end) + ")");
}

void ShardReader::read(bool verify) {
  for (auto& [file, requests] : requests_) {
    std::sort(requests.begin(), requests.end(),
              [](const Request& a, const Request& b) { return a.offset < b.offset; });
    read_file(index_.files[file], requests, verify);
  }
  requests_.clear();
}

void ShardReader::read_file(const std::string& name, std::vector<Request>& requests,
                            bool verify) const {
  const std::string path = checkpoint_.info.path + "/" + name;
  // The source: the probe's bytes in memory (never on disk, nothing to check), or the file.
  const std::string* memory = nullptr;
  if (!checkpoint_.files.empty()) {
    memory = &checkpoint_.file(name);
    verify = false;
  }
  const auto [want_bytes, want_xxh3] =
      memory ? std::pair<int64_t, std::string>{} : checkpoint_.expected(name);
  Fd file;
  if (!memory) {
    file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (file.fd < 0) {
      if (errno == ENOENT) throw DamagedCheckpointError(path + ": missing");
      throw IoError("open", path, errno);
    }
  }
  const auto fetch = [&](char* buf, int64_t n, int64_t pos) -> int64_t {
    if (memory) {
      const int64_t size = static_cast<int64_t>(memory->size());
      const int64_t got = std::max<int64_t>(0, std::min(n, size - pos));
      if (got > 0) std::memcpy(buf, memory->data() + pos, static_cast<size_t>(got));
      return got;
    }
    return static_cast<int64_t>(fs::pread_full(file.fd, buf, static_cast<size_t>(n), pos, path));
  };
  if (!verify) {
    for (const Request& r : requests)
      if (fetch(r.dst, r.bytes, r.offset) != r.bytes)
        throw DamagedCheckpointError(path + ": shorter than its manifest says");
    return;
  }
  // One pass over the whole file: every byte hashed, the requested ones copied out as they pass.
  std::unique_ptr<char[]> buffer(new char[kChunkBytes]);
  Xxh3 hash;
  int64_t pos = 0;
  size_t first = 0;  // requests ending before pos are done
  for (;;) {
    const int64_t got = fetch(buffer.get(), kChunkBytes, pos);
    if (got == 0) break;
    hash.update(buffer.get(), static_cast<size_t>(got));
    for (size_t i = first; i < requests.size() && requests[i].offset < pos + got; ++i) {
      const Request& r = requests[i];
      const int64_t b = std::max(r.offset, pos), e = std::min(r.offset + r.bytes, pos + got);
      if (e > b) std::memcpy(r.dst + (b - r.offset), buffer.get() + (b - pos), e - b);
      if (r.offset + r.bytes <= pos + got && i == first) ++first;
    }
    pos += got;
    if (got < kChunkBytes) break;
  }
  if (pos != want_bytes || hash.hex() != want_xxh3)
    throw DamagedCheckpointError(path + ": " + std::to_string(pos) + " bytes with xxh3 " +
                                 hash.hex() + ", its manifest says " + std::to_string(want_bytes) +
                                 " bytes with xxh3 " + want_xxh3);
}

}  // namespace gpurun

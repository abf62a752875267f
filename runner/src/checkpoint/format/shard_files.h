// The shard files of a sharded checkpoint (shard_index.h has their layout): one rank's state
// copied to host memory and written as its file, and the saved state read back by element
// ranges, at any world size.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "checkpoint/format/checkpoint_types.h"
#include "checkpoint/format/shard_index.h"

namespace gpurun {

class FlatOptimizer;

/// One written shard file: its name and what the manifest's files table records of it, or
/// the error that kept it from being written (the save then fails on every rank alike).
struct ShardFileEntry {
  std::string name;
  int64_t bytes = 0;
  std::string xxh3;
  std::string error;  ///< "" when written
  int error_number = 0;
  nlohmann::json to_json() const;
  static ShardFileEntry from_json(const nlohmann::json& j);
};

/// This rank's optimizer state as a sharded save writes it: a host copy taken on the training
/// thread (the stall), written as optim-shard-RRRRR-of-NNNNN.bin.
class HostShardCopy {
 public:
  /// Copies `optimizer`'s state (FlatOptimizer::state(): each a flat fp32 tensor of the rank's
  /// S slice elements, on the device or the host) into host buffers, reused from save to save
  /// (pinned when the state is on a device), with its layout and step count. `optimizer_name`
  /// is optim.name, recorded in the index.
  void copy(FlatOptimizer& optimizer, const std::string& optimizer_name);

  /// The index of the whole save (every rank's file), the same on every rank.
  const ShardIndex& index() const { return index_; }
  int64_t rank() const { return rank_; }
  /// This rank's file name.
  std::string file_name() const;
  /// Bytes of this rank's file: states x S x 4.
  int64_t file_bytes() const;

  /// Writes this rank's file into `folder` in large writes, hashing the bytes as they are
  /// written, then fsyncs it. Transient errors are retried (fs.h); others throw IoError.
  /// Test fault point "shard_write" (util/faults.h) after the first section.
  ShardFileEntry write(const std::string& folder) const;

  /// The file's bytes in memory (the memory probe's checkpoint, which is never on disk).
  std::string bytes() const;

  /// Frees the host buffers (a CPU run's host memory is its device memory).
  void release() { buffers_.clear(); }

 private:
  ShardIndex index_;
  int64_t rank_ = 0;
  std::vector<at::Tensor> buffers_;  ///< one per index_.states, S fp32 elements each
};

/// Reads saved state by element ranges: each rank asks for the elements it now owns and gets
/// them from whichever files hold them (intersecting ranges: resharding at any world size).
class ShardReader {
 public:
  /// The checkpoint's index, from its manifest (meta.extra is not used). Throws
  /// DamagedCheckpointError when the manifest has no usable sharded_optimizer member.
  explicit ShardReader(const LoadedCheckpoint& checkpoint);

  const ShardIndex& index() const { return index_; }

  /// Asks for elements `range` of the parameter named `parameter`, state `state`, into `dst`
  /// (range.size() fp32 values), read by read(). Throws ResumeError when the checkpoint has no
  /// such parameter or state, or the range is outside the parameter; DamagedCheckpointError
  /// when its chunks do not hold the range.
  void want(const std::string& parameter, const std::string& state, ElementRange range, float* dst);

  /// Reads every range asked for. `verify`: each file that holds one is read once from start
  /// to end and checked against the manifest's size and xxh3 as it passes (a resume, which
  /// must not trust bytes it has not checked); without, only the ranges are read (export,
  /// after the view verified the checkpoint). Throws DamagedCheckpointError when a file is not
  /// what the manifest says, IoError when it cannot be read. Clears the requests.
  void read(bool verify);

 private:
  struct Request {
    int64_t offset = 0, bytes = 0;
    char* dst = nullptr;
  };
  void read_file(const std::string& name, std::vector<Request>& requests, bool verify) const;

  const LoadedCheckpoint& checkpoint_;
  ShardIndex index_;
  std::map<size_t, std::vector<Request>> requests_;  ///< by index_.files position
};

}  // namespace gpurun

// The checkpoint directory protocol of design.md ("Checkpoint directory"):
//
//   DIR/LATEST                   name of the newest complete checkpoint, replaced atomically, last
//   DIR/ckpt-e0003-s0000450/     one complete checkpoint: manifest.json + data files
//   DIR/.tmp-ckpt-.../           a checkpoint being written (ignored by readers, cleaned)
//   DIR/ckpt-....damaged/        a checkpoint that failed verification, never loaded again
//
// A save writes every file into a temporary folder inside DIR (same file system, so the
// final rename is atomic), fsyncs each, writes manifest.json (sizes + xxh3 of every file)
// last, fsyncs the folder, renames it to its final name, fsyncs DIR, and only then replaces
// LATEST and applies retention. A crash at any point leaves the previous complete
// checkpoint untouched and loadable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpurun {

/// Version of the checkpoint layout and manifest; bumped on incompatible change.
inline constexpr int kCheckpointFormatVersion = 1;

/// What a checkpoint records besides its data files (all stored in manifest.json).
struct CheckpointMeta {
  int64_t epoch = 0;              ///< the epoch to continue in (0-based); after epoch e ends: e+1
  int64_t global_step = 0;        ///< optimizer steps completed
  int64_t position_in_epoch = 0;  ///< samples of `epoch`'s permutation already consumed
  int64_t world_size = 1;
  std::string config_hash;        ///< config_hash() of the run's config
  nlohmann::json config;          ///< config_to_json() of the run's config
  nlohmann::json plan = nlohmann::json::object();  ///< the memory plan in force
  std::string model_digest;       ///< model_digest() of the weights, 16 hex digits
  int64_t threads = 0;            ///< intra-op threads used (determinism)
  std::string cpu_capability;     ///< LibTorch's CPU vector capability (determinism)
  nlohmann::json extra = nlohmann::json::object();  ///< free-form, kept as is
};

/// One checkpoint to be written: its metadata and its files' bytes, already in host memory
/// (so the writer may run on a background thread while training goes on).
struct CheckpointSnapshot {
  CheckpointMeta meta;
  std::vector<std::pair<std::string, std::string>> files;  ///< file name -> bytes
};

/// A checkpoint found on disk.
struct CheckpointInfo {
  std::string name;  ///< folder name, e.g. ckpt-e0001-s0000120
  std::string path;  ///< DIR/name
  bool complete = false;     ///< manifest present and every file's size and xxh3 match
  std::string problem;       ///< why it is not complete ("model.pt: checksum mismatch")
  nlohmann::json manifest;   ///< parsed manifest.json when readable, else null
  int64_t global_step = -1;  ///< from the manifest, or from the name when it is unreadable
  int64_t bytes = 0;         ///< total size of its files
};

/// A verified checkpoint read back into memory.
struct LoadedCheckpoint {
  CheckpointInfo info;
  CheckpointMeta meta;
  std::vector<std::pair<std::string, std::string>> files;  ///< file name -> bytes (verified)
  /// Bytes of the file `name`; throws ResumeError when the checkpoint lacks it.
  const std::string& file(const std::string& name) const;
};

/// Result of one save.
struct SaveResult {
  std::string path;
  int64_t bytes = 0;
  double write_seconds = 0;  ///< wall time from the first write to LATEST replaced
  std::vector<std::string> removed;  ///< checkpoints deleted by retention
};

/// "ckpt-e0003-s0000450" for epoch 3, global step 450.
std::string checkpoint_name(int64_t epoch, int64_t global_step);

/// A checkpoint directory. Not thread-safe: one writer at a time (the trainer guarantees it).
class CheckpointStore {
 public:
  /// `dir` is created on the first save. `keep_last` >= 1 complete checkpoints are kept.
  CheckpointStore(std::string dir, int64_t keep_last);

  const std::string& dir() const { return dir_; }

  /// Writes `snapshot` as described at the top of this file, then deletes the oldest complete
  /// checkpoints beyond keep_last (never the one just written). Transient storage errors are
  /// retried; on failure the temporary folder is removed and IoError is thrown, leaving every
  /// complete checkpoint and LATEST as they were.
  SaveResult save(const CheckpointSnapshot& snapshot);

  /// Every ckpt-* folder (damaged and .tmp-* excluded), oldest first by global step. With
  /// `verify`, each file's checksum is checked; without, only the manifest's presence.
  std::vector<CheckpointInfo> list(bool verify) const;

  /// True when DIR holds at least one ckpt-* folder (complete or not).
  bool has_checkpoints() const;

  /// The newest complete checkpoint, checksums verified. A newest one that fails
  /// verification is renamed to NAME.damaged (so it is never loaded again), a warning is
  /// logged, and the previous one is tried. Returns nullopt when DIR holds no checkpoint;
  /// throws ResumeError naming every damaged checkpoint and its problem when all fail.
  std::optional<LoadedCheckpoint> load_latest();

  /// Loads one checkpoint folder (a ckpt-* path), verifying it; throws ResumeError.
  static LoadedCheckpoint load(const std::string& path);

  /// Verifies one checkpoint folder without loading its data into the caller.
  static CheckpointInfo inspect(const std::string& path, bool verify);

  /// Removes leftover .tmp-* folders (from a writer killed mid-save).
  void clean_temporaries();

 private:
  std::string dir_;
  int64_t keep_last_;
  int64_t saves_ = 0;  ///< saves started, for the test-only fault points (faults.h)
};

CheckpointMeta meta_from_manifest(const nlohmann::json& manifest);

}  // namespace gpurun

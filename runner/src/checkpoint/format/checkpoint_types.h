// What a checkpoint is, as data: its metadata, the snapshot a save writes, what a reader found,
// the names of its folders, what LATEST holds and a directory at a glance. Every room that
// handles checkpoints (memory/'s probes, train/, queue/, the commands) includes these types;
// where checkpoints live is checkpoint/storage/ (docs/architecture.md, "Checkpoint directory").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/byte_sink.h"

namespace gpurun {

/// Version of the checkpoint layout and manifest; bumped on incompatible change.
/// 2: the manifest carries a checksum of its own (checkpoint/manifest.h); 1 (read, with the
/// folder name's check alone) has none. A sharded checkpoint's manifest is version 3
/// (kShardedFormatVersion, checkpoint/shard_index.h), the newest this gpurun reads.
inline constexpr int kCheckpointFormatVersion = 2;

/// What a checkpoint records besides its data files (all stored in manifest.json).
struct CheckpointMeta {
  int64_t epoch = 0;              ///< the epoch to continue in (0-based); after epoch e ends: e+1
  int64_t global_step = 0;        ///< optimizer steps completed
  int64_t position_in_epoch = 0;  ///< samples of `epoch`'s permutation already consumed
  int64_t world_size = 1;
  std::string config_hash;                         ///< config_hash() of the run's config
  nlohmann::json config;                           ///< config_to_json() of the run's config
  nlohmann::json plan = nlohmann::json::object();  ///< the memory plan in force
  std::string model_digest;                        ///< model_digest() of the weights, 16 hex digits
  int64_t threads = 0;                             ///< intra-op threads used (determinism)
  std::string cpu_capability;  ///< LibTorch's CPU vector capability (determinism)
  nlohmann::json extra = nlohmann::json::object();  ///< free-form, kept as is
  /// A sharded checkpoint's ShardIndex::to_json() (checkpoint/shard_index.h), written as the
  /// manifest's sharded_optimizer with format_version 3; null for an unsharded one (optim.pt).
  nlohmann::json sharded_optimizer;
};

/// One checkpoint to be written: its metadata and its files, each either bytes in host memory
/// or a source that generates them as they are written (HostStateCopy::build(): the archive's
/// small parts, and every tensor's bytes straight from the host copy), so that the writer may
/// run on a background thread while training goes on, holding no image of a file.
struct CheckpointSnapshot {
  CheckpointMeta meta;
  std::vector<std::pair<std::string, std::string>> files;  ///< file name -> bytes
  /// file name -> its bytes' source, written after `files`; it may be run more than once (a
  /// write retried after a transient storage error), and must give the same bytes each time.
  std::vector<std::pair<std::string, ByteSource>> streamed;

  /// A sharded save: the temporary folder (CheckpointStore::shard_folder()) where every rank
  /// wrote its shard file, and those files' manifest entries ({name: {bytes, xxh3}}). The save
  /// moves them into the checkpoint beside `files` and `streamed` (checkpoint/shard_store.cpp).
  std::string shard_folder;
  nlohmann::json shard_files = nlohmann::json::object();

  /// Moves every streamed file into `files` (runs its source into memory).
  void materialize();
};

/// A checkpoint found on disk.
struct CheckpointInfo {
  std::string name;  ///< folder name, e.g. ckpt-e0001-s0000120
  std::string path;  ///< DIR/name
  /// The manifest verifies (its own xxh3, its epoch and step those of the folder's name) and
  /// every file's size, and when checked its xxh3, match it.
  bool complete = false;
  std::string problem;       ///< why it is not complete ("model.pt: checksum mismatch")
  nlohmann::json manifest;   ///< parsed manifest.json when readable, else null
  int64_t epoch = -1;        ///< from the manifest, or from the name when it is unreadable
  int64_t global_step = -1;  ///< from the manifest, or from the name when it is unreadable
  int64_t bytes = 0;         ///< total size of its files
  /// The manifest carries a checksum of its own and it matched; false for a manifest of
  /// format_version 1, which has none (only its folder name's epoch and step were checked).
  bool sealed = false;
};

/// A checkpoint chosen to be loaded (its files' sizes checked, or their checksums too): its
/// files are read from info.path when they are loaded (train_state's loads, which check them
/// as they read), or, for the memory probe's checkpoint that is never on disk, held in `files`.
struct LoadedCheckpoint {
  CheckpointInfo info;
  CheckpointMeta meta;
  std::vector<std::pair<std::string, std::string>> files;  ///< in memory: file name -> bytes
  /// Bytes of the in-memory file `name`; throws ResumeError when the checkpoint lacks it.
  const std::string& file(const std::string& name) const;
  /// The manifest's size in bytes and xxh3 of the file `name`; throws ResumeError when the
  /// manifest has no usable entry for it.
  std::pair<int64_t, std::string> expected(const std::string& name) const;
};

/// Result of one save.
struct SaveResult {
  std::string path;
  int64_t bytes = 0;
  double write_seconds = 0;          ///< wall time from the first write to LATEST replaced
  std::vector<std::string> removed;  ///< checkpoints deleted by retention
};

/// "ckpt-e0003-s0000450" for epoch 3, global step 450.
std::string checkpoint_name(int64_t epoch, int64_t global_step);

/// The epoch and global step a checkpoint folder's name carries.
struct CheckpointName {
  int64_t epoch = 0;
  int64_t global_step = 0;
};

/// Parses a name as checkpoint_name() writes it, also with a suffix (NAME.damaged):
/// "ckpt-e0003-s0000450" gives {3, 450}. nullopt for a name of another form.
std::optional<CheckpointName> parse_checkpoint_name(const std::string& name);

/// True for the folder names readers consider checkpoints: ckpt-*, except those set aside for
/// good as damaged (NAME.damaged, NAME.damaged.N).
bool is_checkpoint_folder_name(const std::string& name);

/// What DIR/LATEST holds. LATEST is a hint for people and scripts: the newest complete
/// checkpoint is decided by verified manifests, never by LATEST.
struct LatestFile {
  enum class State { kMissing, kUnreadable, kPresent };
  State state = State::kMissing;
  /// kPresent: the file's bytes without trailing whitespace, as they are (possibly garbage:
  /// print describe(), never this).
  std::string name;
  std::string error;  ///< kUnreadable: why (the IoError's message)

  /// True when LATEST is present and names `checkpoint`.
  bool names(const std::string& checkpoint) const;
  /// For messages, with every byte a terminal would act on escaped (\x00, \xff, \n):
  /// `LATEST names "ckpt-e0001-s0000010"`, `LATEST is missing`, `LATEST is empty` or
  /// `LATEST cannot be read (...)`.
  std::string describe() const;
};

/// How a read-only view treats a file that exists but cannot be read (EACCES, or EIO after the
/// retries of fs.h). A file that is not a regular file (a directory where model.pt belongs) is
/// always a problem of its checkpoint: that is damage, not a failing storage.
enum class ReadErrors {
  kReport,  ///< as that checkpoint's problem ("model.pt: cannot be read (...)"): commands that
            ///< report on a directory (ckpt, export) go on to the other checkpoints
  kThrow,   ///< as IoError: a resume must not set a good checkpoint aside because the storage
            ///< failed for a moment
};

/// A checkpoint directory at a glance: what `gpurun status`, `gpurun report`, `gpurun export` and
/// the queue say of it (CheckpointView::summary()).
struct CheckpointSummary {
  bool checksums = false;  ///< the files' xxh3 were read; false: their sizes only
  /// The newest checkpoint that verifies (as `checksums` says): the one a resume takes.
  std::optional<CheckpointInfo> newest_complete;
  /// The ckpt-* folders newer than newest_complete, newest first, each with its problem.
  std::vector<CheckpointInfo> newer_damaged;
  /// The folders set aside as damaged (NAME.damaged), oldest first (CheckpointView::set_aside()).
  std::vector<CheckpointInfo> set_aside;

  /// The newest ckpt-* folder, complete or not; null when there is none.
  const CheckpointInfo* newest() const;
  /// The newest folder set aside whose step is above newest_complete's (all steps after the
  /// newest complete checkpoint that a resume found damaged); null when there is none.
  const CheckpointInfo* lost() const;
  /// True when there is a checkpoint, the newest verifies and none newer was set aside.
  bool ok() const { return newest_complete && newer_damaged.empty() && !lost(); }
  /// One line, names escaped: "ckpt-e0002-s0000200 (sizes match; checksums not read)",
  /// "DAMAGED: ckpt-e0002-s0000200 (model.pt: missing); a resume takes ckpt-e0001-s0000185
  /// (verified)", with "; 1 set aside as damaged (ckpt-....damaged)" when some are, or "none".
  std::string describe() const;
};

/// The metadata a manifest records; throws ResumeError naming a missing or mistyped field.
CheckpointMeta meta_from_manifest(const nlohmann::json& manifest);

}  // namespace gpurun

// The checkpoint directory protocol of docs/architecture.md ("Checkpoint directory"):
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
#include <functional>
#include <mutex>
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

/// A read-only view of a checkpoint directory (the layout at the top of this file): what is
/// there, what verifies, what LATEST says. It never writes, renames or deletes anything, so it
/// is safe on a directory a live run is writing. The one reader of that layout: the store
/// itself, `gpurun ckpt` and `gpurun export` all go through it.
class CheckpointView {
 public:
  /// A view of the checkpoint root `dir` (which need not exist: it then holds nothing).
  explicit CheckpointView(std::string dir, ReadErrors read_errors = ReadErrors::kReport);

  const std::string& dir() const { return dir_; }

  /// Every ckpt-* folder (damaged and .tmp-* excluded), oldest first by global step. With
  /// `verify`, each file's checksum is checked; without, only sizes against the manifest (whose
  /// own checksum is always checked). A folder that retention deleted while it was examined is
  /// left out.
  /// Throws IoError when DIR cannot be listed, or (kThrow) a file cannot be read.
  std::vector<CheckpointInfo> list(bool verify) const;

  /// The folders a resume set aside as damaged (NAME.damaged, NAME.damaged.N), oldest first by
  /// the step their name carries: name, path, epoch and global step (-1 when the name has
  /// none), problem "set aside as damaged". Nothing inside them is read. Throws IoError when
  /// DIR cannot be listed.
  std::vector<CheckpointInfo> set_aside() const;

  /// DIR at a glance: with `verify` the checksums of the newest checkpoints are read, as far
  /// back as the newest that verifies; without, every folder's manifest and sizes (list(false)).
  /// Throws IoError as list().
  CheckpointSummary summary(bool verify) const;

  /// True when DIR holds at least one ckpt-* folder (complete or not). Throws IoError.
  bool has_checkpoints() const;

  /// The newest checkpoint whose checksums verify; each newer one that does not is logged as
  /// a warning ("skipping NAME, which does not verify (PROBLEM)") and left where it is.
  /// nullopt when none verifies. Reads only as far back as needed. Throws IoError as list().
  std::optional<CheckpointInfo> newest_complete() const;

  /// The newest complete entry of `infos` (sorted as list() returns them), or null.
  static const CheckpointInfo* newest_complete(const std::vector<CheckpointInfo>& infos);

  /// The global step of the newest complete checkpoint by its manifest and file sizes (no
  /// checksums read: list(false)); -1 when there is none. Throws IoError as list().
  int64_t newest_complete_step() const;

  /// DIR/LATEST; kUnreadable rather than a throw when it exists but cannot be read.
  LatestFile latest() const;

  /// True when `path` is one checkpoint folder rather than a checkpoint root: its name is
  /// checkpoint_name()'s pattern (NAME.damaged included) or it holds a manifest.json.
  static bool is_checkpoint_folder(const std::string& path);

  /// Examines one checkpoint folder: its manifest, and every file's size (and with `verify`
  /// its xxh3). Throws IoError as list().
  static CheckpointInfo inspect(const std::string& folder, bool verify,
                                ReadErrors read_errors = ReadErrors::kReport);

 private:
  std::string dir_;
  ReadErrors read_errors_;
};

/// A checkpoint directory. Not thread-safe: one writer at a time (the trainer guarantees it).
class CheckpointStore {
 public:
  /// `dir` is created on the first save. `keep_last` >= 1 complete checkpoints are kept.
  CheckpointStore(std::string dir, int64_t keep_last);

  const std::string& dir() const { return dir_; }

  /// What DIR holds, read-only. A file that cannot be read throws IoError (ReadErrors::kThrow).
  const CheckpointView& view() const { return view_; }

  /// Writes `snapshot` as described at the top of this file, then deletes the oldest complete
  /// checkpoints beyond keep_last (never the one just written). Transient storage errors are
  /// retried; on failure the temporary folder is removed and IoError is thrown, leaving every
  /// complete checkpoint and LATEST as they were.
  SaveResult save(const CheckpointSnapshot& snapshot);

  /// A new temporary folder DIR/.tmp-NAME-shards-PID for the shard files of the sharded save of
  /// checkpoint NAME (every rank writes its own there; readers ignore and clean_temporaries()
  /// removes .tmp-* folders). Throws IoError.
  std::string shard_folder(const std::string& name);

  /// Copies the checkpoint folder `folder` of another tier (checkpoint.local_dir) into DIR
  /// with the protocol of save(): every file is streamed into a temporary folder and checked
  /// against the source's manifest as it passes, manifest.json is copied unchanged, then the
  /// fsyncs, the rename, LATEST and retention. A complete checkpoint of that name in DIR is
  /// kept. Throws IoError when DIR (or the source) cannot be written (read), ResumeError when
  /// the source does not match its manifest; DIR's complete checkpoints stay as they were.
  /// `between_chunks`, when given, is called before every chunk of 8 MiB (where a background
  /// copy yields to the disk's other writers).
  SaveResult copy_from(const std::string& folder, const std::function<void()>& between_chunks = {});

  /// Retention never removes a checkpoint for which `keep(name)` is true (the one a copy to
  /// the network tier is reading). Called before the first save; `keep` must be thread-safe.
  void set_retention_guard(std::function<bool(const std::string& name)> keep) {
    retention_guard_ = std::move(keep);
  }

  /// `writing(true)` before a save's or a copy's files are written into DIR, `writing(false)`
  /// after (also when it fails): the local tier holds the network copy's disk traffic off its
  /// saves with it. Called before the first save; `writing` must be thread-safe.
  void set_write_hook(std::function<void(bool writing)> writing) {
    write_hook_ = std::move(writing);
  }

  /// Applies retention now (as after a save), never removing `keep` (a folder name): for a
  /// checkpoint the retention guard spared while it was copied, and at a resume, where a lower
  /// keep_last takes effect before the first save (which a full disk may never let succeed).
  /// Never while a save of this store runs. Returns the names removed.
  std::vector<std::string> retain(const std::string& keep = "") { return apply_retention(keep); }

  /// view().list(verify).
  std::vector<CheckpointInfo> list(bool verify) const { return view_.list(verify); }

  /// view().has_checkpoints().
  bool has_checkpoints() const { return view_.has_checkpoints(); }

  /// The newest complete checkpoint: with `verify`, its checksums verified; without, its
  /// files' sizes, so that the load reads the files once and checks them as it reads
  /// (restore_state), calling set_aside_damaged() and this again when they do not match. A
  /// newest one that fails is renamed to NAME.damaged (so it is never loaded again), a warning
  /// is logged, and the previous one is tried. Returns nullopt when DIR holds no checkpoint;
  /// throws ResumeError naming every damaged checkpoint and its problem when all fail, or
  /// when DIR holds only checkpoints set aside as damaged.
  std::optional<LoadedCheckpoint> load_latest(bool verify = true);

  /// Renames the checkpoint `info` of DIR, which its load found damaged (`problem`), to
  /// NAME.damaged and logs a warning, so that load_latest() takes the previous one. Throws
  /// ResumeError when it cannot be renamed (load_latest() would take it again).
  void set_aside_damaged(const CheckpointInfo& info, const std::string& problem);

  /// Loads one checkpoint folder (a ckpt-* path), verifying it; throws ResumeError.
  static LoadedCheckpoint load(const std::string& path);

  /// Removes leftover .tmp-* folders (from a writer killed mid-save).
  void clean_temporaries();

  /// Keeps save() from making a checkpoint complete (its final rename) while the returned
  /// lock is held, waiting at most `seconds` for a rename in progress; check owns_lock().
  /// What a stop records as saved then stays true until the process exits.
  std::unique_lock<std::timed_mutex> hold_commits(double seconds);

 private:
  /// The test-only fault points (faults.h) of one save or copy, and its number.
  struct FaultPoints {
    const char* before_rename;
    const char* before_latest;
    int64_t attempt;
  };
  using Fill = std::function<int64_t(const std::string& tmp)>;
  /// save() of a snapshot with a shard_folder (shard_store.cpp): the shard files are renamed
  /// into the checkpoint's temporary folder, the other files written beside them, the manifest
  /// last (fault point "before_manifest" just before it).
  SaveResult save_sharded(const CheckpointSnapshot& snapshot);
  /// The manifest's files table of what is being written, called only when a complete
  /// checkpoint of that name exists already (to say whether it holds the same bytes).
  using FilesTable = std::function<nlohmann::json()>;
  /// write_folder(), then LATEST and retention.
  SaveResult commit(const std::string& name, const FilesTable& files, const FaultPoints& faults,
                    const Fill& fill);
  /// Makes DIR/name complete: `fill` writes every file, manifest.json last, into a temporary
  /// folder and returns the data bytes; then the folder's fsync and the rename. A complete
  /// checkpoint of that name is kept instead (its bytes returned). Returns the bytes on disk.
  int64_t write_folder(const std::string& name, const FilesTable& files, const FaultPoints& faults,
                       const Fill& fill);
  /// Deletes the complete checkpoints beyond keep_last and the incomplete ones older than the
  /// newest complete one, never `just_written`; logs failures. Returns the names removed.
  std::vector<std::string> apply_retention(const std::string& just_written);

  std::string dir_;
  int64_t keep_last_;
  std::timed_mutex commit_mutex_;  ///< held around the rename that completes a checkpoint
  CheckpointView view_;
  int64_t saves_ = 0;   ///< saves started, for the test-only fault points (faults.h)
  int64_t copies_ = 0;  ///< copy_from() calls started, likewise
  std::function<bool(const std::string&)> retention_guard_;
  std::function<void(bool)> write_hook_;
};

CheckpointMeta meta_from_manifest(const nlohmann::json& manifest);

}  // namespace gpurun

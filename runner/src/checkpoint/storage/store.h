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
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/format/checkpoint_types.h"
#include "checkpoint/storage/checkpoint_storage.h"
#include "gpurun/config.h"

namespace gpurun {

/// A read-only view of a checkpoint directory (the layout at the top of this file): what is
/// there, what verifies, what LATEST says. It never writes, renames or deletes anything, so it
/// is safe on a directory a live run is writing. The one reader of that layout: the store
/// itself, `gpurun ckpt` and `gpurun export` all go through it.
class CheckpointView {
 public:
  /// A view of the checkpoint root `dir` (which need not exist: it then holds nothing): a
  /// folder, or s3://BUCKET/PREFIX (open_storage()). Throws ConfigError as open_storage().
  explicit CheckpointView(std::string dir, ReadErrors read_errors = ReadErrors::kReport);
  explicit CheckpointView(std::shared_ptr<CheckpointStorage> storage,
                          ReadErrors read_errors = ReadErrors::kReport);

  /// Where the root lives.
  const std::shared_ptr<CheckpointStorage>& storage() const { return storage_; }

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

  /// Examines the folder `name` of this root as list() does (verify: checksums too).
  CheckpointInfo examine(const std::string& name, bool verify) const;

  /// True when `path` is one checkpoint folder rather than a checkpoint root: its name is
  /// checkpoint_name()'s pattern (NAME.damaged included) or it holds a manifest.json.
  static bool is_checkpoint_folder(const std::string& path);

  /// Examines one checkpoint folder: its manifest, and every file's size (and with `verify`
  /// its xxh3). Throws IoError as list().
  static CheckpointInfo inspect(const std::string& folder, bool verify,
                                ReadErrors read_errors = ReadErrors::kReport);

 private:
  std::string dir_;
  std::shared_ptr<CheckpointStorage> storage_;
  ReadErrors read_errors_;
};

/// A checkpoint directory. Not thread-safe: one writer at a time (the trainer guarantees it).
class CheckpointStore {
 public:
  /// `dir` (a folder or s3://BUCKET/PREFIX, open_storage()) is created on the first save.
  /// `keep_last` >= 1 complete checkpoints are kept.
  CheckpointStore(std::string dir, int64_t keep_last);
  CheckpointStore(std::shared_ptr<CheckpointStorage> storage, int64_t keep_last);

  /// Where the root lives.
  const std::shared_ptr<CheckpointStorage>& storage() const { return storage_; }

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
  /// copy_from() of the folder `name` of another root: the other tier, or a bucket that a
  /// resume brings to the local disk (its files verified as they arrive).
  SaveResult copy_from(const CheckpointStorage& from, const std::string& name,
                       const std::function<void()>& between_chunks = {});

  /// Retention never removes a checkpoint for which `keep(name)` is true (the one a copy to
  /// the network tier is reading). Called before the first save; `keep` must be thread-safe.
  void set_retention_guard(std::function<bool(const std::string& name)> keep) {
    retention_guard_ = std::move(keep);
  }

  /// checkpoint.keep_best: retention never deletes the `best.k` complete checkpoints whose
  /// manifests record the best `best.metric` (mode min or max; ties keep the older one,
  /// metric_rank.h), and, while it is on, no incomplete folder either (its metric cannot be
  /// read, so it might be one of them; it is logged instead). keep_last counts the newest
  /// complete checkpoints beside them. A metric of "" (the default) is off.
  void set_keep_best(KeepBestConfig best) { keep_best_ = std::move(best); }

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
  /// What a fill wrote: the data bytes and the manifest's text, which the commit writes last.
  struct Filled {
    int64_t bytes = 0;
    std::string manifest;
  };
  using Fill = std::function<Filled(FolderWrite& folder)>;
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
  /// Makes DIR/name complete: `fill` writes every file into the storage's FolderWrite and
  /// returns the data bytes and the manifest, which FolderWrite::commit() writes last. A complete
  /// checkpoint of that name is kept instead (its bytes returned). Returns the bytes stored.
  int64_t write_folder(const std::string& name, const FilesTable& files, const FaultPoints& faults,
                       const Fill& fill);
  /// Deletes the complete checkpoints beyond keep_last and the incomplete ones older than the
  /// newest complete one, never `just_written` nor one keep_best protects (set_keep_best());
  /// logs failures. The test-only fault point "retention_remove" (faults.h) comes before each
  /// removal. Returns the names removed.
  std::vector<std::string> apply_retention(const std::string& just_written);

  std::string dir_;
  std::shared_ptr<CheckpointStorage> storage_;
  int64_t keep_last_;
  std::timed_mutex commit_mutex_;  ///< held around the rename that completes a checkpoint
  CheckpointView view_;
  int64_t saves_ = 0;   ///< saves started, for the test-only fault points (faults.h)
  int64_t copies_ = 0;  ///< copy_from() calls started, likewise
  std::function<bool(const std::string&)> retention_guard_;
  std::function<void(bool)> write_hook_;
  KeepBestConfig keep_best_;
  std::vector<std::string> kept_incomplete_;  ///< incomplete folders keep_best kept, logged once
};

}  // namespace gpurun

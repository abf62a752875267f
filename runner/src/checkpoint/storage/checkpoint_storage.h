// Where a checkpoint root lives: a folder of a file system (PosixStorage) or a prefix of an S3
// bucket (ObjectStorage). The directory protocol (storage/store.h: the folders, LATEST,
// retention, the copy between tiers, "set aside as damaged") and the lease (storage/lease.h)
// are written once, against this interface; each implementation gives its operations the
// guarantees the protocol needs (docs/architecture.md, "Checkpoint directory", "Object storage").
//
// Names are relative to the root: "LATEST", "lease.json", "ckpt-e0001-s0000010" (a folder),
// "ckpt-e0001-s0000010/model.pt" (a file of a folder).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "util/byte_sink.h"

namespace gpurun {

/// One stored file: its size in bytes (-1: missing) and whether it is a plain file (a directory
/// or a FIFO where a file belongs is damage, not a file).
struct StoredFile {
  int64_t size = -1;
  bool regular = false;
};

/// A checkpoint folder being written. Nothing of it is visible to readers (CheckpointStorage::
/// folders()) until commit() returns; a writer killed at any moment leaves only what
/// clean_temporaries() removes.
class FolderWrite {
 public:
  virtual ~FolderWrite() = default;

  /// Streams `source` into the file `name` of the folder; `observe` sees every byte as it is
  /// stored, and `restart`, when given, is called before every run of `source` (the first, and
  /// again after a transient error). Returns the file's size in bytes. Throws IoError; what
  /// `source` throws is rethrown.
  virtual int64_t write(const std::string& name, const ByteSource& source,
                        const ByteSink& observe = {},
                        const std::function<void()>& restart = {}) = 0;

  /// Makes the local file `path` (written and fsync'd by a rank of a sharded save) the file
  /// `name` of the folder. Throws IoError.
  virtual void adopt(const std::string& name, const std::string& path) = 0;

  /// Writes manifest.json (`manifest`) last, and makes the folder complete under its final
  /// name, replacing an incomplete folder of that name. `before_commit` runs just before the
  /// step that makes it visible (the test-only fault point); `commit_mutex` is held around that
  /// step. Throws IoError; the folder is then not visible.
  virtual void commit(const std::string& manifest, const std::function<void()>& before_commit,
                      std::timed_mutex& commit_mutex) = 0;

  /// Removes what was written, when commit() was not reached or failed. Never throws.
  virtual void abort() noexcept = 0;
};

class CheckpointStorage {
 public:
  virtual ~CheckpointStorage() = default;

  /// The root as the user wrote it ("/mnt/nas/exp1", "s3://bucket/exp1"), for messages.
  virtual const std::string& root() const = 0;
  /// root() + "/" + name: the path of a folder or a file in messages and CheckpointInfo::path.
  std::string path(const std::string& name) const;
  /// A file system the process can open files of (the loaders read a checkpoint in place there).
  virtual bool is_local() const = 0;

  /// Proves that checkpoints can be written here: creates the root when missing and writes,
  /// reads back and removes a probe. Throws ConfigError naming the cause and `what` ("--ckpt").
  virtual void check_writable(const std::string& what) = 0;

  /// Proves quickly (within seconds, without the retries of reads) that the root can be read:
  /// for a bucket, that the endpoint answers, the credentials are accepted and the bucket
  /// exists. Throws ConfigError naming the cause. A file system: nothing to prove.
  virtual void check_readable() {}

  /// Why the lease cannot be trusted here ("" when it can): a bucket whose server ignores
  /// If-None-Match / If-Match would let two runs both believe they hold it. Throws IoError.
  virtual std::string lease_problem() { return ""; }

  /// The checkpoint folders of the root (is_checkpoint_folder_name()), unsorted: on a file
  /// system every such directory, complete or not; in a bucket the prefixes whose manifest is
  /// written (the commit), less those a marker sets aside. Throws IoError.
  virtual std::vector<std::string> folders() const = 0;
  /// The names of the folders set aside as damaged (NAME.damaged, NAME.damaged.N). Throws IoError.
  virtual std::vector<std::string> set_aside_names() const = 0;
  /// Whether the folder `name` is there (a reader lists, then examines: retention may have
  /// removed it meanwhile). Throws IoError.
  virtual bool has_folder(const std::string& name) const = 0;

  /// The file `name`; size -1 when it is missing. Throws IoError for other errors.
  virtual StoredFile status(const std::string& name) const = 0;
  /// Every byte of the file `name`, in order, into `out`. Throws IoError (ENOENT: missing).
  virtual void read(const std::string& name, const ByteSink& out) const = 0;
  /// The whole (small) file `name`. Throws IoError (ENOENT: missing).
  std::string read_all(const std::string& name) const;
  /// The size and xxh3 (16 hex digits) of the file `name`, read once. Throws IoError.
  virtual std::pair<int64_t, std::string> checksum(const std::string& name) const;

  /// Starts writing the folder `name` (checkpoint_name()). Throws IoError.
  virtual std::unique_ptr<FolderWrite> write_folder(const std::string& name) = 0;
  /// Replaces the small file `name` (LATEST) at once: readers see the old or the new bytes.
  virtual void replace(const std::string& name, const std::string& bytes) = 0;
  /// Removes the folder `name` and its files; readers stop seeing it first. Throws IoError.
  virtual void remove_folder(const std::string& name) = 0;
  /// Sets the folder `name` aside as damaged, so that no reader takes it again; returns the
  /// name it is known by now (NAME.damaged). Throws IoError.
  virtual std::string set_aside(const std::string& name) = 0;
  /// Removes what writers that were killed left behind. Never while a save of this root runs.
  virtual void clean_temporaries() = 0;

  /// The conditional writes of the lease. `expect` is told the file's current bytes (nullopt:
  /// absent) and says whether the change goes ahead; a concurrent change between that read and
  /// the write makes it fail (on a file system only from the read to the rename: POSIX has
  /// nothing stronger across hosts; in a bucket never, with If-Match / If-None-Match).
  using Expect = std::function<bool(const std::optional<std::string>& current)>;
  /// Writes `bytes` as the file `name` when `expect` holds. Returns whether it was written.
  /// Throws IoError.
  virtual bool replace_if(const std::string& name, const std::string& bytes,
                          const Expect& expect) = 0;
  /// Removes the file `name` when `expect` holds. Returns whether it was removed. Throws IoError.
  virtual bool remove_if(const std::string& name, const Expect& expect) = 0;
};

/// The storage of a checkpoint root: ObjectStorage for "s3://BUCKET/PREFIX", else PosixStorage.
/// Throws ConfigError for an s3:// root without usable settings (s3/s3_settings.h).
std::shared_ptr<CheckpointStorage> open_storage(const std::string& root);

/// True for a root open_storage() gives to ObjectStorage ("s3://...").
bool is_object_root(const std::string& root);

/// A checkpoint folder's path split into its root and name: "/a/b/ckpt-x/" -> {"/a/b",
/// "ckpt-x"}, "s3://b/p/ckpt-x" -> {"s3://b/p", "ckpt-x"}.
std::pair<std::string, std::string> split_folder_path(const std::string& path);

}  // namespace gpurun

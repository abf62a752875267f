// Durable file operations for checkpoints on network storage (NFS, SMB, FUSE mounts).
//
// Every write is followed by fsync of the file and, after a rename, of the directory, so a
// power loss or a reclaimed instance leaves either the old or the new content, never a mix
// (the protocol of "ext4 data=ordered" and of rename(2)'s atomicity within one file system).
// Transient errors of network file systems (EIO, ESTALE, ETIMEDOUT, EINTR) are retried with
// exponential backoff, each retry logged with the path and errno.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "util/byte_sink.h"

namespace gpurun::fs {

/// Sees each chunk of a copy or a write as it passes: a checksum, a progress bar.
using ChunkObserver = ByteSink;

/// Writes `data` to `path` (created or truncated), then fsyncs it. Throws IoError.
void write_file(const std::string& path, const std::string& data);

/// Writes `data` to a temporary file beside `path`, fsyncs, renames it over `path`, and
/// fsyncs the directory: readers see the old or the new content. Throws IoError.
void replace_file(const std::string& path, const std::string& data);

/// Writes the file `path` (created or truncated) as `produce` generates it, then fsyncs it once,
/// holding no image of the file. On a local disk (ext4, xfs, btrfs) a file past 2 MiB is written
/// around the page cache (O_DIRECT) from four aligned 2 MiB staging buffers by a thread of its
/// own, overlapping `produce` (util/direct_write.h). Elsewhere (NFS, SMB, FUSE, tmpfs) it goes
/// through the cache: small pieces (a zip's headers, a pickle) are gathered into writes of up to
/// 1 MiB, large ones (a tensor's bytes) are written straight from the caller's memory in
/// sequential 8 MiB writes, and past 256 MiB handed to writeback 256 MiB behind, which bounds the
/// file's dirty pages in the cache to about 576 MiB. `observe`, when given, sees every byte in
/// file order just before it is written (a checksum while the bytes are hot in the cache).
/// Retried as write_file() on a transient error: `reset`, when given, is called before every
/// attempt (the observer starts over), and `produce` runs again. Returns the file's size.
/// Throws IoError; what `produce` throws is rethrown as it is.
int64_t write_streamed(const std::string& path, const ByteSource& produce,
                       const ChunkObserver& observe = {}, const std::function<void()>& reset = {});

/// Appends `data` to `path` (created when missing) in a single write(2), then fsyncs: a reader
/// sees all of it or, after a crash, a cut tail. Throws IoError (a short write: ENOSPC).
void append_bytes(const std::string& path, const std::string& data);

/// append_bytes(path, line + '\n').
void append_line(const std::string& path, const std::string& line);

/// Copies `from` to `to` (created or truncated) with 8 MiB sequential reads and writes, then
/// fsyncs `to`; `observe`, when given, sees every chunk in order. Returns the bytes copied.
/// Not retried (an observer would see bytes twice): callers retry the whole copy with a
/// fresh observer. Throws IoError.
int64_t copy_file(const std::string& from, const std::string& to,
                  const ChunkObserver& observe = {});

/// The whole file. Throws IoError (errno ENOENT when it does not exist).
std::string read_file(const std::string& path);

/// The whole file, read once into a buffer of its size; `observe` sees every chunk as it
/// arrives (a checksum computed while the bytes are hot in the cache, not in a second pass).
/// Retried as read_file(), with the observer called again from the start: it must reset
/// itself when `reset` is called first. Throws IoError.
std::string read_file(const std::string& path, const ChunkObserver& observe,
                      const std::function<void()>& reset);

/// rename(2) followed by fsync of the destination's directory. Throws IoError.
void rename_durable(const std::string& from, const std::string& to);

/// fsync of a directory, so that entries created or renamed in it are durable. Throws IoError.
void sync_dir(const std::string& dir);

/// Whether `path` exists (lstat(2): a dangling symlink exists). Throws IoError for other errors.
bool exists(const std::string& path);

/// Size of `path` in bytes (stat(2)), or -1 when it does not exist. Throws IoError.
int64_t file_size(const std::string& path);

/// What stat(2) says of `path` (symlinks followed).
struct FileStatus {
  int64_t size = -1;     ///< bytes; -1 when it does not exist
  bool regular = false;  ///< a regular file (not a directory, FIFO, socket or device)
};

/// stat(2) of `path`; a missing path is FileStatus{} (size -1). Throws IoError.
FileStatus status(const std::string& path);

/// The names in `dir` (without "." and ".."), sorted; empty when `dir` does not exist.
/// Throws IoError.
std::vector<std::string> list_dir(const std::string& dir);

/// This machine's folder of gpurun's own files that are not a run's (an s3:// run's local tier
/// and run folder, data staged from a bucket): $XDG_CACHE_HOME/gpurun, else ~/.cache/gpurun
/// (the XDG base directory specification's default), else /tmp/.cache/gpurun without $HOME.
std::string cache_dir();

/// mkdir -p. Throws IoError.
void make_dirs(const std::string& dir);

/// rm -rf; a missing path is not an error. Throws IoError.
void remove_all(const std::string& path);

/// True for the errno values a network file system returns for a transient fault.
bool is_transient(int err) noexcept;

/// Runs `op` and retries it up to `attempts` times on a transient IoError, sleeping
/// 0.1 s, 0.2 s, 0.4 s, ... between tries; any other error is rethrown at once.
template <typename Op>
auto with_retries(Op&& op, int attempts = 5) -> decltype(op());

}  // namespace gpurun::fs

#include "util/fs_retry.h"

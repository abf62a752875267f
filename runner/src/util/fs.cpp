#include "util/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <vector>

#include <spdlog/spdlog.h>

#include "gpurun/errors.h"
#include "util/direct_write.h"
#include "util/fd_io.h"

namespace gpurun::fs {
namespace {

namespace stdfs = std::filesystem;

[[noreturn]] void throw_errno(const char* what, const std::string& path) {
  throw IoError(what, path, errno);
}

// Owns one file descriptor; close() reports the error that a network file system may only
// report at close time (NFS flushes on close), the destructor closes quietly.
class UniqueFd {
 public:
  UniqueFd(const std::string& path, int flags, mode_t mode = 0644)
      : fd_(::open(path.c_str(), flags | O_CLOEXEC, mode)), path_(path) {
    if (fd_ < 0) throw_errno("open", path_);
  }
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }

  void fsync() const {
    if (::fsync(fd_) != 0) throw_errno("fsync", path_);
  }

  void close() {
    const int fd = fd_;
    fd_ = -1;
    // On Linux the descriptor is released even when close(2) fails with EINTR.
    if (::close(fd) != 0 && errno != EINTR) throw_errno("close", path_);
  }

 private:
  int fd_;
  std::string path_;
};

// Writes a large file at the disk's speed with a bounded amount of it dirty in the page cache:
// write(2) in 8 MiB chunks into the cache, as torch.save does; once a file is past kLag, each
// kBlock that falls kLag behind the end is handed to writeback (sync_file_range), and the one
// 2 x kLag behind is waited for. A file up to kLag is left to the final fsync whole, which lets
// the file system allocate and submit it in the fewest, largest requests: handing every 8 MiB
// chunk to writeback at once and waiting two chunks back (the textbook streaming idiom) took
// twice as long here (gpurun_bench_checkpoint_memory, scripts/bench/checkpoint.sh's 421 MiB
// state on ext4: 0.81-1.30 s against 0.36-0.50 s). A file of tens of GB then holds at most 2 x kLag
// + kBlock dirty, so the final fsync waits for at most that much, and the cache of a small
// container is not filled with one file's dirty pages. A file system that cannot (or a failed hint)
// falls back to the plain fsync at the end, which reports any real write error.
class StreamingWrite {
 public:
  static constexpr size_t kChunk = size_t{8} << 20;
  static constexpr off_t kBlock = off_t{64} << 20;
  static constexpr off_t kLag = off_t{256} << 20;
  StreamingWrite(int fd, const std::string& path) : fd_(fd), path_(path) {}
  void write(const char* p, size_t n) {
    write_all(fd_, p, n, path_);
    const off_t before = offset_;
    offset_ += static_cast<off_t>(n);
    // Each kBlock boundary crossed by this write past kLag + kBlock: the block ending kLag
    // behind it goes to writeback, the one ending 2 x kLag behind is waited for.
    for (off_t end = (before / kBlock + 1) * kBlock; hint_ && end <= offset_; end += kBlock) {
      if (end < kLag + kBlock) continue;
      if (::sync_file_range(fd_, end - kLag - kBlock, kBlock, SYNC_FILE_RANGE_WRITE) != 0) {
        hint_ = false;
        return;
      }
      if (end >= 2 * kLag + kBlock)
        (void)::sync_file_range(
            fd_, end - 2 * kLag - kBlock, kBlock,
            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    }
  }

 private:
  int fd_;
  const std::string& path_;
  off_t offset_ = 0;
  bool hint_ = true;
};

std::string parent_dir(const std::string& path) {
  std::string parent = stdfs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// The pieces of a stream, written in file order: small ones gathered into a buffer of kGather
// bytes (a zip archive's headers arrive tens of bytes at a time), large ones written from the
// producer's own memory in StreamingWrite's chunks, each seen by `observe` just before it is
// written, while it is in the cache.
class GatheringWrite {
 public:
  static constexpr size_t kGather = size_t{1} << 20;
  GatheringWrite(StreamingWrite& out, const ChunkObserver& observe)
      : out_(out), observe_(observe) {}
  void put(const char* p, size_t n) {
    if (n == 0) return;
    if (used_ + n <= kGather && buffer_) {
      std::memcpy(buffer_.get() + used_, p, n);
      used_ += n;
      return;
    }
    flush();
    if (n < kGather) {
      if (!buffer_) buffer_.reset(new char[kGather]);
      std::memcpy(buffer_.get(), p, n);
      used_ = n;
      return;
    }
    for (size_t at = 0; at < n; at += StreamingWrite::kChunk)
      write(p + at, std::min(StreamingWrite::kChunk, n - at));
  }
  void flush() {
    if (used_ > 0) write(buffer_.get(), used_);
    used_ = 0;
  }
  int64_t written() const { return written_; }

 private:
  void write(const char* p, size_t n) {
    if (observe_) observe_(p, n);
    out_.write(p, n);
    written_ += static_cast<int64_t>(n);
  }
  StreamingWrite& out_;
  const ChunkObserver& observe_;
  std::unique_ptr<char[]> buffer_;  ///< allocated at the first small piece (not zeroed)
  size_t used_ = 0;
  int64_t written_ = 0;
};

int64_t write_streamed_once(const std::string& path, const ByteSource& produce,
                            const ChunkObserver& observe) {
  UniqueFd fd(path, O_WRONLY | O_CREAT | O_TRUNC);
  int64_t written = 0;
  if (detail::direct_io_suits(fd.get())) {
    detail::DirectWrite out(fd.get(), path, observe);
    produce([&](const char* p, size_t n) { out.put(p, n); });
    written = out.finish();
  } else {
    StreamingWrite out(fd.get(), path);
    GatheringWrite gather(out, observe);
    produce([&](const char* p, size_t n) { gather.put(p, n); });
    gather.flush();
    written = gather.written();
  }
  fd.fsync();
  fd.close();
  return written;
}

std::string read_file_once(const std::string& path, const ChunkObserver& observe = {}) {
  UniqueFd fd(path, O_RDONLY);
  std::string out;
  struct stat st {};
  if (::fstat(fd.get(), &st) == 0 && st.st_size > 0) {
    // Read straight into the string's own buffer, in 8 MiB requests.
    out.resize(static_cast<size_t>(st.st_size));
    (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  size_t used = 0;
  char probe[1 << 16];  // past the size fstat gave: a file that grew, or one of /proc
  for (;;) {
    const bool in_place = used < out.size();
    char* into = in_place ? out.data() + used : probe;
    const size_t want = in_place ? std::min(out.size() - used, size_t{8} << 20) : sizeof probe;
    const ssize_t n = ::read(fd.get(), into, want);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw_errno("read", path);
    }
    if (n == 0) break;
    if (observe) observe(into, static_cast<size_t>(n));
    if (!in_place) out.append(probe, static_cast<size_t>(n));
    used += static_cast<size_t>(n);
  }
  out.resize(used);
  fd.close();
  return out;
}

void sync_dir_once(const std::string& dir) {
  UniqueFd fd(dir, O_RDONLY | O_DIRECTORY);
  // Some network and FUSE file systems cannot fsync a directory (EINVAL, ENOTSUP); there the
  // rename is as durable as the file system makes it, and failing the save would not help.
  if (::fsync(fd.get()) != 0 && errno != EINVAL && errno != ENOTSUP) throw_errno("fsync", dir);
  fd.close();
}

}  // namespace

namespace detail {
void log_retry(const IoError& e, int attempt, int attempts, double delay_seconds) {
  spdlog::warn("{}; attempt {}/{} failed, retrying in {:.1f} s", e.what(), attempt, attempts,
               delay_seconds);
}
}  // namespace detail

bool is_transient(int err) noexcept {
  return err == EIO || err == ESTALE || err == ETIMEDOUT || err == EINTR || err == EAGAIN ||
         err == EWOULDBLOCK;
}

void write_file(const std::string& path, const std::string& data) {
  write_streamed(path, [&](const ByteSink& out) { out(data.data(), data.size()); });
}

int64_t write_streamed(const std::string& path, const ByteSource& produce,
                       const ChunkObserver& observe, const std::function<void()>& reset) {
  // O_TRUNC makes the whole sequence idempotent, so it is retried as one unit. fsync alone is
  // never retried: after a failed fsync Linux may drop the dirty pages and report success.
  return with_retries([&] {
    if (reset) reset();
    return write_streamed_once(path, produce, observe);
  });
}

void replace_file(const std::string& path, const std::string& data) {
  static std::atomic<unsigned long long> counter{0};
  const stdfs::path target(path);
  const std::string tmp =
      (target.parent_path() / ("." + target.filename().string() + ".tmp-" +
                               std::to_string(::getpid()) + "-" + std::to_string(counter++)))
          .string();
  try {
    write_file(tmp, data);
    rename_durable(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());  // best effort; the error that matters is the one rethrown
    throw;
  }
}

void append_line(const std::string& path, const std::string& line) {
  append_bytes(path, line + '\n');
}

void append_bytes(const std::string& path, const std::string& data) {
  // Opening is safe to retry; the write is not (a retried append could duplicate the line),
  // except for EINTR/EAGAIN, which write_all handles because nothing was written.
  auto fd =
      with_retries([&] { return std::make_unique<UniqueFd>(path, O_WRONLY | O_CREAT | O_APPEND); });
  // A short append (disk full) would leave a partial line or record, which glues itself to
  // the next one (metrics.jsonl) or ends the file for its readers (a TFRecord): the file is
  // cut back to its size before the append, and the failure reported. Appends to a file come
  // from one thread (report/file_writer.h), so nothing else grew it in between.
  const off_t before = ::lseek(fd->get(), 0, SEEK_END);
  try {
    const ssize_t n = ::write(fd->get(), data.data(), data.size());
    if (n < 0) {
      if (errno != EINTR && errno != EAGAIN) throw_errno("append", path);
      write_all(fd->get(), data.data(), data.size(), path);
    } else if (static_cast<size_t>(n) != data.size()) {
      throw IoError("append (short write of " + std::to_string(n) + " of " +
                        std::to_string(data.size()) + " bytes)",
                    path, ENOSPC);
    }
  } catch (const IoError&) {
    if (before >= 0 && ::ftruncate(fd->get(), before) != 0) {
      // The partial tail stays; the error already being reported says why.
    }
    throw;
  }
  fd->fsync();
  fd->close();
}

int64_t copy_file(const std::string& from, const std::string& to, const ChunkObserver& observe) {
  UniqueFd in(from, O_RDONLY);
  UniqueFd out(to, O_WRONLY | O_CREAT | O_TRUNC);
  // Sequential access doubles the kernel's read-ahead; large chunks keep the copy at disk speed
  // on network file systems, where every request is a round trip.
  (void)::posix_fadvise(in.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  // Not a std::vector: its 8 MiB would be zeroed for every copy, only to be overwritten.
  const std::unique_ptr<char[]> buf(new char[StreamingWrite::kChunk]);
  StreamingWrite writer(out.get(), to);
  int64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(in.get(), buf.get(), StreamingWrite::kChunk);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw_errno("read", from);
    }
    if (n == 0) break;
    if (observe) observe(buf.get(), static_cast<size_t>(n));
    writer.write(buf.get(), static_cast<size_t>(n));
    total += n;
  }
  out.fsync();
  out.close();
  in.close();
  return total;
}

std::string read_file(const std::string& path) {
  return with_retries([&] { return read_file_once(path); });
}

std::string read_file(const std::string& path, const ChunkObserver& observe,
                      const std::function<void()>& reset) {
  return with_retries([&] {
    reset();
    return read_file_once(path, observe);
  });
}

void rename_durable(const std::string& from, const std::string& to) {
  bool retried = false;
  with_retries([&] {
    if (::rename(from.c_str(), to.c_str()) == 0) return;
    const int err = errno;
    // A rename that timed out on NFS may have been done by the server; the retry then finds
    // `from` gone and `to` present, which is the result we wanted.
    if (retried && err == ENOENT && ::access(from.c_str(), F_OK) != 0 &&
        ::access(to.c_str(), F_OK) == 0) {
      return;
    }
    retried = true;
    throw IoError("rename to " + to + " from", from, err);
  });
  const std::string to_dir = parent_dir(to);
  const std::string from_dir = parent_dir(from);
  sync_dir(to_dir);
  if (stdfs::path(from_dir).lexically_normal() != stdfs::path(to_dir).lexically_normal()) {
    sync_dir(from_dir);
  }
}

void sync_dir(const std::string& dir) {
  with_retries([&] { sync_dir_once(dir); });
}

bool exists(const std::string& path) {
  return with_retries([&] {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) return true;
    if (errno != ENOENT) throw_errno("stat", path);
    return false;
  });
}

int64_t file_size(const std::string& path) { return status(path).size; }

FileStatus status(const std::string& path) {
  return with_retries([&] {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      return FileStatus{static_cast<int64_t>(st.st_size), S_ISREG(st.st_mode)};
    }
    if (errno != ENOENT) throw_errno("stat", path);
    return FileStatus{};
  });
}

std::vector<std::string> list_dir(const std::string& dir) {
  return with_retries([&] {
    std::vector<std::string> names;
    std::error_code ec;
    stdfs::directory_iterator it(dir, ec), end;
    if (ec == std::errc::no_such_file_or_directory) return names;
    for (; !ec && it != end; it.increment(ec)) names.push_back(it->path().filename().string());
    if (ec) throw IoError("list", dir, ec.value());
    std::sort(names.begin(), names.end());
    return names;
  });
}

std::string cache_dir() {
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string base =
      cache && *cache ? cache : std::string(home && *home ? home : "/tmp") + "/.cache";
  return base + "/gpurun";
}

void make_dirs(const std::string& dir) {
  // mkdir one component at a time, so that each new directory's entry is made durable with an
  // fsync of its parent (std::filesystem::create_directories does not say which it created).
  stdfs::path prefix;
  for (const auto& part : stdfs::path(dir).lexically_normal()) {
    if (part.empty()) continue;  // a trailing separator
    prefix /= part;
    const std::string p = prefix.string();
    const bool created = with_retries([&] {
      if (::mkdir(p.c_str(), 0755) == 0) return true;
      if (errno != EEXIST) throw_errno("mkdir", p);
      return false;
    });
    if (created) {
      sync_dir(parent_dir(p));
    } else {
      struct stat st {};
      if (::stat(p.c_str(), &st) != 0) throw_errno("stat", p);
      if (!S_ISDIR(st.st_mode)) throw IoError("mkdir", p, ENOTDIR);
    }
  }
}

void remove_all(const std::string& path) {
  with_retries([&] {
    std::error_code ec;
    stdfs::remove_all(path, ec);
    if (ec) throw IoError("remove", path, ec.value());
  });
}

}  // namespace gpurun::fs

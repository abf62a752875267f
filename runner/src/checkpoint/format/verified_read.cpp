#include "checkpoint/format/verified_read.h"

#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <future>
#include <memory>

#include "gpurun/errors.h"

namespace gpurun {

VerifyingFileReader::VerifyingFileReader(std::string path, int64_t bytes, std::string xxh3)
    : path_(std::move(path)), want_(std::move(xxh3)), size_(static_cast<size_t>(bytes)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw IoError("open", path_, errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw IoError("stat", path_, err);
  }
  if (st.st_size != bytes) {
    ::close(fd_);
    throw DamagedCheckpointError(path_ + ": size " + std::to_string(st.st_size) +
                                 " != " + std::to_string(bytes) + " in manifest");
  }
  // Sequential: the kernel reads ahead of the records, which come in file order.
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

VerifyingFileReader::~VerifyingFileReader() {
  if (fd_ >= 0) ::close(fd_);
}

size_t VerifyingFileReader::size() const { return size_; }

size_t VerifyingFileReader::pread_all(uint64_t pos, char* buf, size_t n) const {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd_, buf + got, n - got, static_cast<off_t>(pos + got));
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      // Not thrown from here: read() is called from inside the zip reader's C code, which an
      // exception must not cross. A short read fails the reader; verify() names the cause.
      int expected = 0;
      read_errno_.compare_exchange_strong(expected, errno);
      break;
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

size_t VerifyingFileReader::read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const {
  char* into = static_cast<char*>(buf);
  if (n < kSplitBytes) {
    const size_t got = pread_all(pos, into, n);
    std::lock_guard<std::mutex> lock(mutex_);
    observe(pos, into, got);
    return got;
  }
  // A large record (a tensor) in two halves at once: the kernel's copy into fresh pages,
  // page faults included, is most of a load, and two cores do it in about half the time.
  // The first half is hashed while the second is still being read.
  const size_t half = n / 2;
  std::future<size_t> second =
      std::async(std::launch::async, [&] { return pread_all(pos + half, into + half, n - half); });
  const size_t first = pread_all(pos, into, half);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    observe(pos, into, first);
  }
  const size_t rest = second.get();
  if (first < half) return first;
  std::lock_guard<std::mutex> lock(mutex_);
  observe(pos + half, into + half, rest);
  return half + rest;
}

void VerifyingFileReader::observe(uint64_t pos, const char* data, size_t n) const {
  const uint64_t end = pos + n;
  if (end <= hashed_) return;  // read again (the zip's directory, a header)
  if (pos > hashed_) {
    hash_aside();
    // A record's data starts past the part of its local header that the zip reader reads
    // (the name and the alignment padding are skipped): read those few bytes now, so that
    // the record is hashed as it passes instead of set aside and the file read twice.
    if (pos > hashed_ && pos - hashed_ <= kGapFillBytes) {
      char gap[kGapFillBytes];
      const size_t want = static_cast<size_t>(pos - hashed_);
      const size_t got = pread_all(hashed_, gap, want);
      hash_.update(gap, got);
      hashed_ += got;
    }
  }
  if (pos <= hashed_) {
    const size_t skip = static_cast<size_t>(hashed_ - pos);
    hash_.update(data + skip, n - skip);
    hashed_ = end;
    hash_aside();
  } else if (aside_bytes_ + n <= kAsideLimitBytes) {
    aside_.emplace(pos, std::string(data, n));
    aside_bytes_ += n;
  }
  // Beyond the limit the bytes are read again by verify(): memory stays bounded whatever
  // order a reader takes.
}

void VerifyingFileReader::hash_aside() const {
  while (!aside_.empty() && aside_.begin()->first <= hashed_) {
    auto it = aside_.begin();
    const uint64_t end = it->first + it->second.size();
    if (end > hashed_) {
      const size_t skip = static_cast<size_t>(hashed_ - it->first);
      hash_.update(it->second.data() + skip, it->second.size() - skip);
      hashed_ = end;
    }
    aside_bytes_ -= it->second.size();
    aside_.erase(it);
  }
}

void VerifyingFileReader::verify() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (const int err = read_errno_.load()) throw IoError("read", path_, err);
  hash_aside();
  const size_t chunk = size_t{1} << 20;  // hashed while in the cache
  std::unique_ptr<char[]> buf;
  while (hashed_ < size_) {
    const uint64_t gap_end =
        aside_.empty() ? size_ : std::min<uint64_t>(size_, aside_.begin()->first);
    if (!buf) buf.reset(new char[chunk]);
    const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk, gap_end - hashed_));
    const size_t got = pread_all(hashed_, buf.get(), want);
    if (const int err = read_errno_.load()) throw IoError("read", path_, err);
    if (got == 0) break;  // shorter than its size now
    hash_.update(buf.get(), got);
    hashed_ += got;
    reread_bytes_ += static_cast<int64_t>(got);
    hash_aside();
  }
  const std::string got = hash_.hex();
  if (hashed_ != size_ || got != want_)
    throw DamagedCheckpointError(path_ + " does not match its manifest: xxh3 " + got + " over " +
                                 std::to_string(hashed_) + " bytes, manifest " + want_ + " over " +
                                 std::to_string(size_));
}

int64_t VerifyingFileReader::reread_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reread_bytes_;
}

}  // namespace gpurun

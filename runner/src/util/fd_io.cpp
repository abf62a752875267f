#include "util/fd_io.h"

#include <unistd.h>

#include <cerrno>

#include "gpurun/errors.h"

namespace gpurun::fs {

namespace {
bool retried(int error) { return error == EINTR || error == EAGAIN; }
}  // namespace

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (retried(errno)) continue;
      throw IoError("write", path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void pwrite_all(int fd, const char* p, size_t n, off_t at, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, at);
    if (w < 0) {
      if (retried(errno)) continue;
      throw IoError("write", path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
    at += w;
  }
}

size_t pread_full(int fd, char* p, size_t n, off_t at, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, p + got, n - got, at + static_cast<off_t>(got));
    if (r < 0) {
      if (retried(errno)) continue;
      throw IoError("read", path, errno);
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

}  // namespace gpurun::fs

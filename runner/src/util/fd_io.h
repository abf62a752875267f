// Whole reads and writes on a file descriptor: the loops around read(2)/write(2) that a short
// transfer or a signal needs, in one place.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace gpurun::fs {

/// write(2)s all n bytes of p to fd. EINTR and EAGAIN wrote nothing and are retried; any other
/// error throws IoError("write", path, errno), some bytes possibly written.
void write_all(int fd, const char* p, size_t n, const std::string& path);

/// pwrite(2)s all n bytes of p at byte offset `at` of fd; the retries and errors of write_all.
void pwrite_all(int fd, const char* p, size_t n, off_t at, const std::string& path);

/// pread(2)s n bytes at byte offset `at` of fd into p, or up to the end of the file. Returns
/// the bytes read: fewer than n only where the file ends. EINTR and EAGAIN are retried; any
/// other error throws IoError("read", path, errno).
size_t pread_full(int fd, char* p, size_t n, off_t at, const std::string& path);

}  // namespace gpurun::fs

#include "util/hash.h"

#include <xxhash.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <new>
#include <vector>

#include "gpurun/errors.h"
#include "util/fs.h"

namespace gpurun {

Xxh3::Xxh3() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3::~Xxh3() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3::update(const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

uint64_t Xxh3::digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

std::string Xxh3::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(digest()));
  return buf;
}

std::string xxh3_hex(const std::string& data) {
  Xxh3 h;
  h.update(data.data(), data.size());
  return h.hex();
}

std::pair<int64_t, std::string> xxh3_file(const std::string& path) {
  return fs::with_retries([&] {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return std::make_pair(int64_t{-1}, std::string());
      throw IoError("open", path, errno);
    }
    Xxh3 hash;
    int64_t size = 0;
    std::vector<char> buf(1 << 20);
    for (;;) {
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        throw IoError("read", path, err);
      }
      if (n == 0) break;
      hash.update(buf.data(), static_cast<size_t>(n));
      size += n;
    }
    ::close(fd);
    return std::make_pair(size, hash.hex());
  });
}

}  // namespace gpurun

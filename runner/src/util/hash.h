// Checksums: xxHash's XXH3-64 (https://github.com/Cyan4973/xxHash), printed as 16 hex digits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace gpurun {

/// Incremental XXH3-64 over byte ranges.
class Xxh3 {
 public:
  Xxh3();
  ~Xxh3();
  Xxh3(const Xxh3&) = delete;
  Xxh3& operator=(const Xxh3&) = delete;
  void update(const void* data, size_t bytes);
  uint64_t digest() const;
  std::string hex() const;  ///< 16 lowercase hex digits

 private:
  void* state_;
};

/// XXH3-64 of one byte string, as 16 lowercase hex digits.
std::string xxh3_hex(const std::string& data);

/// Size and xxh3 (16 hex digits) of the file `path`, read in 1 MiB chunks, so that verifying a
/// file never holds all of it in memory; size -1 (and "") when it does not exist. Transient
/// errors are retried (fs::with_retries); others throw IoError.
std::pair<int64_t, std::string> xxh3_file(const std::string& path);

}  // namespace gpurun

#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "gpurun/errors.h"

namespace gpurun {

namespace {

constexpr int32_t kGpt2Magic = 20240520;    // llm.c dev/data/data_common.py, HEADERS_INFO
constexpr int32_t kLlama3Magic = 20240801;  // the same, "llama-3"
constexpr int64_t kHeaderBytes = 256 * 4;

template <typename Id>
int64_t copy_ids(const Id* src, int64_t count, int64_t* out) {
  // One pass, branch-free, so that the compiler vectorises the widening and the maximum.
  Id largest = 0;
  for (int64_t i = 0; i < count; ++i) {
    const Id v = src[i];
    out[i] = static_cast<int64_t>(v);
    largest = std::max(largest, v);
  }
  return static_cast<int64_t>(largest);
}

}  // namespace

TokenFile::TokenFile(const std::string& path, const std::string& key, int raw_width,
                     int64_t resident_bytes)
    : path_(path), key_(key), width_(raw_width), resident_bytes_(resident_bytes) {
  const std::string where = key + ": " + path;
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw ConfigError(where + ": cannot open: " + std::strerror(errno));
  try {  // the destructor does not run for a constructor that throws: close the file here
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw IoError("stat", path, errno);
    if (S_ISDIR(st.st_mode))
      throw ConfigError(where + " is a directory; the tokens data set reads one file");
    const int64_t bytes = st.st_size;
    if (bytes == 0) throw ConfigError(where + " is empty: it holds no tokens");

    int32_t head[3] = {0, 0, 0};
    if (bytes >= kHeaderBytes && ::pread(fd_, head, sizeof head, 0) != sizeof head)
      throw IoError("read", path, errno);
    if (raw_width != 1 && (head[0] == kGpt2Magic || head[0] == kLlama3Magic)) {
      const bool gpt2 = head[0] == kGpt2Magic;
      const int32_t version = gpt2 ? 1 : 7;
      layout_ = gpt2 ? Layout::kLlmcGpt2 : Layout::kLlmcLlama3;
      width_ = gpt2 ? 2 : 4;
      header_ = kHeaderBytes;
      if (head[1] != version)
        throw ConfigError(where + " has llm.c's magic number " + std::to_string(head[0]) +
                          " with version " + std::to_string(head[1]) + "; gpurun reads version " +
                          std::to_string(version) + " (" + (gpt2 ? "uint16" : "uint32") + " ids)");
      const int64_t body = bytes - kHeaderBytes;
      if (body % width_ != 0 || body / width_ != head[2])
        throw ConfigError(where + ": its llm.c header says " + std::to_string(head[2]) +
                          " tokens of " + std::to_string(width_) + " bytes after the " +
                          std::to_string(kHeaderBytes) + "-byte header, but the file has " +
                          std::to_string(body) + " bytes there (truncated, or not this format)");
    } else if (bytes % width_ != 0) {
      throw ConfigError(where + " has " + std::to_string(bytes) + " bytes, not a whole number of " +
                        std::to_string(width_) + "-byte tokens (data.dtype " +
                        (width_ == 2 ? "uint16" : "uint32") + "): truncated, or another dtype");
    }
    tokens_ = (bytes - header_) / width_;
    if (tokens_ == 0) throw ConfigError(where + " holds no tokens after its llm.c header");

    map_bytes_ = static_cast<size_t>(bytes);
    map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd_, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      throw IoError("mmap", path, errno);
    }
    ids_ = static_cast<const unsigned char*>(map_) + header_;
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(map_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

int64_t TokenFile::header_vocabulary() const {
  switch (layout_) {
    case Layout::kLlmcGpt2:
      return 50257;  // GPT-2's BPE (tiktoken "gpt2")
    case Layout::kLlmcLlama3:
      return 128256;  // Llama 3's tokenizer
    case Layout::kRaw:
      break;
  }
  return 0;
}

std::string TokenFile::describe() const {
  const char* dtype = width_ == 1 ? "uint8" : width_ == 2 ? "uint16" : "uint32";
  switch (layout_) {
    case Layout::kLlmcGpt2:
      return std::string("llm.c GPT-2 (") + dtype + ")";
    case Layout::kLlmcLlama3:
      return std::string("llm.c Llama 3 (") + dtype + ")";
    case Layout::kRaw:
      break;
  }
  return std::string("raw ") + dtype;
}

int64_t TokenFile::read(int64_t start, int64_t count, int64_t* out) const {
  if (static_cast<int64_t>(map_bytes_) > resident_bytes_) {
    // The blocks the bytes lie in: what the faults of this read may map (kFaultBlockBytes).
    const int64_t first = (header_ + start * width_) / kFaultBlockBytes;
    const int64_t last = (header_ + (start + count + 1) * width_ - 1) / kFaultBlockBytes;
    const int64_t touched = (last - first + 1) * kFaultBlockBytes;
    if (touched_.fetch_add(touched, std::memory_order_relaxed) + touched > resident_bytes_) {
      touched_.store(0, std::memory_order_relaxed);
      ::madvise(map_, map_bytes_, MADV_DONTNEED);
    }
  }
  if (width_ == 1) return copy_ids(ids_ + start, count, out);
  if (width_ == 2) return copy_ids(reinterpret_cast<const uint16_t*>(ids_) + start, count, out);
  return copy_ids(reinterpret_cast<const uint32_t*>(ids_) + start, count, out);
}

int64_t TokenFile::id(int64_t i) const {
  if (width_ == 1) return ids_[i];
  return width_ == 2 ? reinterpret_cast<const uint16_t*>(ids_)[i]
                     : reinterpret_cast<const uint32_t*>(ids_)[i];
}

void TokenFile::throw_first_out_of_range(int64_t start, int64_t count, int64_t vocabulary) const {
  for (int64_t i = start; i < start + count; ++i) {
    const int64_t value = id(i);
    if (value < vocabulary) continue;
    throw ConfigError(key_ + ": " + path_ + ": token id " + std::to_string(value) +
                      " at token offset " + std::to_string(i) + " (byte offset " +
                      std::to_string(header_ + i * width_) + ") is not below the vocabulary size " +
                      std::to_string(vocabulary) +
                      " (data.vocab_size, or the llm.c header's tokenizer)");
  }
}

void TokenFile::advise(int advice, int64_t start, int64_t count) const {
  // madvise wants a page-aligned start: round the byte range out to whole pages.
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(ids_ + start * width_) & ~(page - 1);
  const auto last = reinterpret_cast<uintptr_t>(ids_ + (start + count) * width_);
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, advice);
}

}  // namespace gpurun

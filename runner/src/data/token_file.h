// A flat binary file of token ids, memory-mapped read-only: nanoGPT's train.bin/val.bin (raw
// uint16 or uint32 ids, nothing else) or llm.c's (dev/data/data_common.py, write_datafile: 256
// little-endian int32s of header, then the ids). The header is recognised by its magic number:
//
//   header[0]  20240520 (GPT-2: version 1, uint16 ids) or 20240801 (Llama 3: version 7, uint32)
//   header[1]  the version
//   header[2]  the number of tokens that follow the 1024 bytes of header
//
// The file is never read whole: the kernel pages in what a window touches. Those pages are clean
// page cache, which the kernel reclaims under memory pressure; but while they stay mapped they
// count in the process's resident set, which would grow to the file's size over an epoch of a
// large file. So after about `resident_bytes` of the mapping have been touched, the mapping's
// pages are dropped from this process (madvise MADV_DONTNEED: the page cache keeps them, the
// next access maps them again without I/O), and the resident set stays bounded whatever the
// file's size. Ids are checked against the vocabulary as they are read. A file truncated while it
// is mapped raises SIGBUS on access: data files must not change under a run (the same holds for
// every mmap reader, numpy's memmap included).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace gpurun {

class TokenFile {
 public:
  enum class Layout { kRaw, kLlmcGpt2, kLlmcLlama3 };
  static constexpr int64_t kDefaultResidentBytes = int64_t{32} << 20;
  /// A read is counted as the whole blocks of this size its bytes lie in: a page fault maps the
  /// whole page-cache folio around the page, up to 2 MiB (PMD size) on kernels with large folios
  /// (Linux 6.x on ext4 and xfs), not 4 KiB plus the 64 KiB of fault-around.
  static constexpr int64_t kFaultBlockBytes = int64_t{2} << 20;

  /// Maps `path`. `key` names the config key that chose it in every message ("data.path");
  /// `raw_width` is the bytes per id of a raw file (2: uint16, 4: uint32; 1: a loss mask's
  /// uint8 bytes, data.mask_path, never read as an llm.c header); a header names its own. Throws
  /// ConfigError naming the file when it cannot be opened or is a directory, is empty, holds no
  /// whole number of ids, or has an llm.c header of an unknown version or whose token count
  /// disagrees with the file's size; IoError when mmap fails. `resident_bytes`: the bytes of the
  /// mapping touched (each read counted as the kFaultBlockBytes blocks it touches) after which its
  /// pages are dropped from the resident set; a file no larger than it is never dropped (it is all
  /// the mapping can hold).
  TokenFile(const std::string& path, const std::string& key, int raw_width,
            int64_t resident_bytes = kDefaultResidentBytes);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& key() const { return key_; }
  Layout layout() const { return layout_; }
  int width() const { return width_; }              ///< bytes per id: 1, 2 or 4
  int64_t tokens() const { return tokens_; }        ///< ids in the file
  int64_t header_bytes() const { return header_; }  ///< 0 (raw) or 1024 (llm.c)
  /// The vocabulary of the header's tokenizer (GPT-2: 50257, Llama 3: 128256); 0 for raw.
  int64_t header_vocabulary() const;
  /// "llm.c GPT-2 (uint16)", "raw uint32": for messages.
  std::string describe() const;

  /// Copies ids [start, start + count) (0 <= start, start + count <= tokens()) into `out` as
  /// int64 and returns the largest. Safe for concurrent calls (a drop of the mapping's pages
  /// under another reader only makes its next access map the page again).
  int64_t read(int64_t start, int64_t count, int64_t* out) const;

  /// The id at `i` (0 <= i < tokens()), as read() reads it (not counted: read() counts the id after
  /// its range).
  int64_t id(int64_t i) const;

  /// Throws ConfigError naming the file, the id, its token offset and byte offset, when an id of
  /// [start, start + count) is >= `vocabulary`; the caller calls it when read() returned such a
  /// maximum, so that the common path pays one comparison per window.
  void throw_first_out_of_range(int64_t start, int64_t count, int64_t vocabulary) const;

  /// madvise(2) advice for the coming accesses (MADV_RANDOM, MADV_WILLNEED, ...) over the ids
  /// [start, start + count); advice is a hint: failures are ignored.
  void advise(int advice, int64_t start, int64_t count) const;

 private:
  std::string path_, key_;
  Layout layout_ = Layout::kRaw;
  int width_ = 2;
  int64_t tokens_ = 0, header_ = 0;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* ids_ = nullptr;  ///< the first id, past the header
  int64_t resident_bytes_;
  mutable std::atomic<int64_t> touched_{0};  ///< bytes touched since the last drop (estimate)
};

}  // namespace gpurun

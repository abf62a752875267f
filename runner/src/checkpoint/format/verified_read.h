// A checkpoint file as a resume loads it: LibTorch's readers (caffe2::serialize::
// PyTorchStreamReader, under torch::jit's unpickler and InputArchive) read it straight from disk
// into the tensors' own storage, in whatever order they ask, and the file is checked against its
// manifest entry on the way. Bytes that arrive in file order are hashed as they pass, and the
// few a reader skips between two records (a local header's name and padding) are read then; the
// few that arrive ahead of it (the zip's directory at the end, the pickle) are kept aside until
// their turn, up to kAsideLimitBytes; anything never asked for, or set aside beyond that limit,
// is read at verify(). So the file is read once, and its xxh3 is that of the whole
// file, as the manifest records it (docs/architecture.md, "Checkpoint loads").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include <caffe2/serialize/read_adapter_interface.h>

#include "util/hash.h"

namespace gpurun {

class VerifyingFileReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  /// Bytes held aside for hashing at most (ahead of the hashed prefix).
  static constexpr size_t kAsideLimitBytes = size_t{64} << 20;
  /// Bytes skipped by the reader (a zip local header's name and padding) that the next read
  /// reads and hashes at most, so that the file is still hashed in one pass.
  static constexpr size_t kGapFillBytes = size_t{4} << 10;
  /// A read at least this large is split between two threads.
  static constexpr size_t kSplitBytes = size_t{4} << 20;

  /// Opens `path`, which its manifest gives `bytes` bytes and the xxh3 `xxh3` (16 hex digits).
  /// Throws IoError when it cannot be opened, DamagedCheckpointError when its size is not
  /// `bytes`.
  VerifyingFileReader(std::string path, int64_t bytes, std::string xxh3);
  ~VerifyingFileReader() override;
  VerifyingFileReader(const VerifyingFileReader&) = delete;
  VerifyingFileReader& operator=(const VerifyingFileReader&) = delete;

  /// The file's size in bytes.
  size_t size() const override;
  /// Reads up to `n` bytes at offset `pos` into `buf` (fewer at the end of the file, or after a
  /// read error, which verify() then throws); returns how many. Never throws: LibTorch calls it
  /// from its zip reader's C code. Thread-safe.
  size_t read(uint64_t pos, void* buf, size_t n, const char* what = "") const override;

  /// Reads what read() did not hash, then compares the whole file's xxh3 with the manifest's.
  /// Throws IoError for a read error (this one's or an earlier read()'s), DamagedCheckpointError
  /// naming the file and both checksums when they differ.
  void verify();

  /// Bytes verify() read a second time (set aside beyond kAsideLimitBytes, or skipped by every
  /// read): 0 when the readers took the file in order.
  int64_t reread_bytes() const;

 private:
  void observe(uint64_t pos, const char* data, size_t n) const;  ///< holds mutex_
  void hash_aside() const;                                       ///< holds mutex_
  size_t pread_all(uint64_t pos, char* buf, size_t n) const;

  std::string path_;
  std::string want_;
  size_t size_;
  int fd_ = -1;
  mutable std::mutex mutex_;
  mutable Xxh3 hash_;
  mutable uint64_t hashed_ = 0;                         ///< bytes [0, hashed_) are hashed
  mutable std::multimap<uint64_t, std::string> aside_;  ///< offset -> bytes ahead of hashed_
  mutable size_t aside_bytes_ = 0;
  int64_t reread_bytes_ = 0;
  mutable std::atomic<int> read_errno_{0};  ///< the first read error's errno
};

}  // namespace gpurun

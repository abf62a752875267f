// Writing a large file around the page cache (O_DIRECT), for fs::write_streamed on local disks.
//
// A buffered write copies every byte into the page cache, whose pages the kernel must first
// allocate (and, on kernels built with init_on_alloc, zero); the final fsync then waits for
// writeback of all of them. Written with O_DIRECT from aligned staging buffers, the bytes go from
// the buffer to the device: no page-cache copy and no cache of gigabytes of checkpoint that no one
// reads soon. Measured on this project's 2-core ext4 VM, whose freed guest pages are reported to
// the host (page_reporting) and fault again on their next use, 432 MiB from `dd` with 5 s
// between runs: 1.55-1.61 s buffered with conv=fsync, 0.37 s with oflag=direct.
//
// The staging buffers are filled on the caller's thread (a copy, then the observer's checksum
// while the bytes are hot) and written by a second thread, so the producer's CPU work (pickling,
// a zip's CRC-32, xxh3) overlaps the device's. Internal to util/fs.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "util/byte_sink.h"

namespace gpurun::fs::detail {

/// Whether `fd`'s file system is one whose O_DIRECT writes gpurun uses: ext2/3/4, xfs and btrfs
/// on a local block device. Network file systems (NFS, SMB), FUSE, overlayfs and tmpfs are
/// written through the page cache, where O_DIRECT is refused, emulated or a round trip per write.
bool direct_io_suits(int fd);

/// One file's bytes, staged in four 2 MiB buffers aligned to 4096 bytes and written in order by
/// a thread of its own: whole buffers with O_DIRECT, the last partial 4096-byte block without
/// (O_DIRECT needs aligned lengths). A file that ends within the first buffer is written in one
/// buffered write(2): a manifest is not worth a thread. If the file system refuses O_DIRECT
/// after all (EINVAL from fcntl or from a write), the rest is written buffered; the caller's
/// fsync makes either durable. Holds at most 8 MiB.
class DirectWrite {
 public:
  /// `fd` stays the caller's (it closes and fsyncs it); `observe`, when set, sees every byte in
  /// file order just after it is staged and before it is written.
  DirectWrite(int fd, const std::string& path, const ByteSink& observe);
  ~DirectWrite();  ///< stops the writing thread; after an exception, what was written is partial
  DirectWrite(const DirectWrite&) = delete;
  DirectWrite& operator=(const DirectWrite&) = delete;

  /// Stages `n` bytes. Throws IoError when an earlier write failed (ENOSPC, EIO).
  void put(const char* p, size_t n);

  /// Writes what is staged and waits for every write. Returns the file's size in bytes. Throws
  /// IoError with the errno of the first failed write.
  int64_t finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpurun::fs::detail

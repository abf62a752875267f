// fs::write_streamed around the page cache (util/direct_write.h), on real file systems mounted
// for the test (tests run as root): an ext4 image on a loop device, where a large file goes
// with O_DIRECT, and a tmpfs, where it goes through the cache. The bytes on disk are the bytes
// produced and observed, a full disk is an IoError (ENOSPC) that ends the write, and the file's
// pages are not left in the cache.
#include "util/direct_write.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/temp_dir.h"

#include "gpurun/errors.h"
#include "util/fs.h"
#include "util/hash.h"

namespace {

namespace stdfs = std::filesystem;
using gpurun::IoError;
using gpurun::Xxh3;

// A file system of `type` mounted at dir/mnt for the test's life: "ext4" is an image of
// `megabytes` formatted with mkfs.ext4 on a loop device, "tmpfs" a tmpfs of that size.
class Mounted {
 public:
  Mounted(const gpurun::test::TempDir& dir, const std::string& type, int megabytes)
      : mnt_(dir / "mnt") {
    stdfs::create_directories(mnt_);
    std::string command;
    if (type == "ext4") {
      const std::string image = dir / "disk.img";
      command = "truncate -s " + std::to_string(megabytes) + "M " + image + " && mkfs.ext4 -q -F " +
                image + " && mount -o loop " + image + " " + mnt_;
    } else {
      command = "mount -t tmpfs -o size=" + std::to_string(megabytes) + "m tmpfs " + mnt_;
    }
    mounted_ = std::system((command + " >/dev/null 2>&1").c_str()) == 0;
  }
  ~Mounted() {
    if (mounted_) ::umount2(mnt_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  std::string operator/(const std::string& name) const { return mnt_ + "/" + name; }
  const std::string& path() const { return mnt_; }

 private:
  std::string mnt_;
  bool mounted_ = false;
};

bool suits(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  const bool yes = gpurun::fs::detail::direct_io_suits(fd);
  ::close(fd);
  return yes;
}

// The pages of `path` in the page cache (mincore of a mapping of the whole file).
size_t resident_pages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  const size_t size = static_cast<size_t>(::lseek(fd, 0, SEEK_END));
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((size + page - 1) / page);
  ::mincore(map, size, in_core.data());
  ::munmap(map, size);
  ::close(fd);
  size_t n = 0;
  for (unsigned char c : in_core) n += c & 1;
  return n;
}

std::string file_xxh3(const std::string& path) {
  Xxh3 h;
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chunk(size_t{8} << 20);
  while (in.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || in.gcount() > 0)
    h.update(chunk.data(), static_cast<size_t>(in.gcount()));
  return h.hex();
}

// Writes `total` bytes in pieces of odd sizes (some within a staging buffer, some across
// several, tiny zip-header-like ones between) from a patterned source; returns the xxh3 of what
// was produced, and in `observed` that of what the observer saw.
std::string write_odd_pieces(const std::string& path, int64_t total, std::string& observed) {
  std::string source((size_t{34} << 20) + 4093, '\0');
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<char>((i * 2654435761u) >> 13);
  const std::vector<size_t> sizes{30, source.size(), 1, (size_t{2} << 20) - 5, 4096, 77};
  std::optional<Xxh3> produced, seen;
  const int64_t n = gpurun::fs::write_streamed(
      path,
      [&](const gpurun::ByteSink& out) {
        produced.emplace();
        int64_t left = total;
        for (size_t k = 0; left > 0; ++k) {
          const size_t size = std::min<size_t>(sizes[k % sizes.size()], left);
          const char* p = source.data() + (k * 4099) % (source.size() - size + 1);
          out(p, size);
          produced->update(p, size);
          left -= static_cast<int64_t>(size);
        }
      },
      [&](const char* data, size_t size) { seen->update(data, size); }, [&] { seen.emplace(); });
  EXPECT_EQ(n, total);
  observed = seen->hex();
  return produced->hex();
}

TEST(DirectWrite, LocalDiskFileSystemsTakeItTmpfsDoesNot) {
  gpurun::test::TempDir dir("direct");
  Mounted ext4(dir, "ext4", 64);
  if (!ext4.mounted()) GTEST_SKIP() << "cannot make and mount an ext4 image here";
  EXPECT_TRUE(suits(ext4.path()));
  gpurun::test::TempDir other("direct");
  Mounted tmpfs(other, "tmpfs", 16);
  ASSERT_TRUE(tmpfs.mounted());
  EXPECT_FALSE(suits(tmpfs.path()));
}

// 40 MiB and an odd tail: the bytes on disk are those produced and those observed, and the
// file is not in the page cache after it (O_DIRECT), except at most its last, partial page.
TEST(DirectWrite, ALargeFileOnALocalDiskIsWrittenWholeAroundTheCache) {
  gpurun::test::TempDir dir("direct");
  Mounted ext4(dir, "ext4", 96);
  if (!ext4.mounted()) GTEST_SKIP() << "cannot make and mount an ext4 image here";
  for (const int64_t total : {(int64_t{40} << 20) + 1234, int64_t{2} << 20, int64_t{6} << 20,
                              (int64_t{8} << 20) + 4096, int64_t{5000}, int64_t{0}}) {
    std::string observed;
    const std::string produced = write_odd_pieces(ext4 / "model.pt", total, observed);
    EXPECT_EQ(observed, produced) << total;
    EXPECT_EQ(file_xxh3(ext4 / "model.pt"), produced) << total;
    EXPECT_EQ(gpurun::fs::file_size(ext4 / "model.pt"), total);
  }
  std::string observed;
  write_odd_pieces(ext4 / "optim.pt", (int64_t{40} << 20) + 1234, observed);
  EXPECT_LE(resident_pages(ext4 / "optim.pt"), 1u);
}

// Through the cache on a tmpfs, which O_DIRECT does not suit: a file past the writeback lag
// (256 MiB) and its wait (512 MiB behind), in pieces of odd sizes, some crossing 64 MiB blocks
// in one write, is whole on disk and is what the observer saw.
TEST(DirectWrite, AFileSystemWithoutItGetsTheSameBytesThroughTheWritebackWindow) {
  gpurun::test::TempDir dir("direct");
  Mounted tmpfs(dir, "tmpfs", 700);
  // Without the right to mount (a container, an unprivileged user), /dev/shm is a tmpfs too
  // where it has the room.
  std::string folder = tmpfs.path();
  struct RemovedAfter {
    std::string path;
    ~RemovedAfter() {
      std::error_code ignored;
      if (!path.empty()) stdfs::remove_all(path, ignored);
    }
  } shm;
  if (!tmpfs.mounted()) {
    struct statfs st {};
    const bool room = ::statfs("/dev/shm", &st) == 0 && st.f_type == TMPFS_MAGIC &&
                      static_cast<uint64_t>(st.f_bavail) * st.f_bsize > (uint64_t{700} << 20);
    if (!room)
      GTEST_SKIP() << "cannot mount a tmpfs here (no right to mount), and /dev/shm is no tmpfs "
                      "with 700 MiB free";
    std::string made = "/dev/shm/gpurun-direct-XXXXXX";
    ASSERT_NE(::mkdtemp(made.data()), nullptr) << std::strerror(errno);
    folder = shm.path = made;
  }
  ASSERT_FALSE(suits(folder)) << folder << " takes O_DIRECT: not the case this test is for";
  std::string observed;
  const std::string produced =
      write_odd_pieces(folder + "/model.pt", (int64_t{600} << 20) + 1234, observed);
  EXPECT_EQ(observed, produced);
  EXPECT_EQ(file_xxh3(folder + "/model.pt"), produced);
}

// A disk that fills in the middle of a direct write: ENOSPC from the writing thread ends the
// write as an IoError naming the file, promptly, and the disk takes a small file afterwards.
TEST(DirectWrite, AFullDiskIsAnIoErrorWithEnospc) {
  gpurun::test::TempDir dir("direct");
  Mounted ext4(dir, "ext4", 32);
  if (!ext4.mounted()) GTEST_SKIP() << "cannot make and mount an ext4 image here";
  int err = 0;
  std::string what;
  try {
    std::string observed;
    write_odd_pieces(ext4 / "optim.pt", int64_t{64} << 20, observed);
  } catch (const IoError& e) {
    err = e.error_number();
    what = e.what();
  }
  EXPECT_EQ(err, ENOSPC) << what;
  EXPECT_NE(what.find("optim.pt"), std::string::npos) << what;
  stdfs::remove(ext4 / "optim.pt");
  gpurun::fs::write_file(ext4 / "LATEST", "ckpt-e0001-s0000010\n");
  EXPECT_EQ(gpurun::fs::read_file(ext4 / "LATEST"), "ckpt-e0001-s0000010\n");
}

}  // namespace

// gpurun::fs on real files in a fresh temporary directory.
#include "util/fs.h"

#include <dlfcn.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/temp_dir.h"

#include "gpurun/errors.h"

namespace {

namespace stdfs = std::filesystem;
using gpurun::IoError;

class FsFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tmp_.path(); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : stdfs::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    return names;
  }

  gpurun::test::TempDir tmp_{"fs"};
  std::string dir_;
};

int errno_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.error_number();
  }
  return 0;
}

// PyPI's LibTorch exports its own unversioned copy of std::filesystem, which crashes when it
// is bound instead of the system's (runner/CMakeLists.txt links libstdc++ first for that).
TEST(FsLinkage, StdFilesystemBindsToTheSystemLibstdcxxNotLibTorchsCopy) {
  using RemoveAll = std::uintmax_t (*)(const std::filesystem::path&, std::error_code&);
  const RemoveAll remove_all = &std::filesystem::remove_all;
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(remove_all), &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  EXPECT_NE(std::string(info.dli_fname).find("libstdc++"), std::string::npos)
      << "std::filesystem::remove_all is bound to " << info.dli_fname;
}

TEST_F(FsFiles, WriteThenReadReturnsTheSameBytes) {
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  gpurun::fs::write_file(path("blob"), data);
  EXPECT_EQ(gpurun::fs::read_file(path("blob")), data);
  gpurun::fs::write_file(path("blob"), "short");  // truncates
  EXPECT_EQ(gpurun::fs::read_file(path("blob")), "short");
  gpurun::fs::write_file(path("empty"), "");
  EXPECT_EQ(gpurun::fs::read_file(path("empty")), "");
}

TEST_F(FsFiles, ReadOfMissingFileThrowsIoErrorWithEnoentAndPath) {
  try {
    gpurun::fs::read_file(path("missing"));
    FAIL() << "no exception";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_number(), ENOENT);
    EXPECT_EQ(e.path(), path("missing"));
    EXPECT_NE(std::string(e.what()).find(path("missing")), std::string::npos) << e.what();
  }
}

TEST_F(FsFiles, WriteIntoMissingDirectoryThrows) {
  EXPECT_EQ(errno_of([&] { gpurun::fs::write_file(path("no/such/file"), "x"); }), ENOENT);
}

TEST_F(FsFiles, ReplaceFileReplacesContentAndLeavesNoTemporary) {
  gpurun::fs::replace_file(path("LATEST"), "old\n");
  gpurun::fs::replace_file(path("LATEST"), "new\n");
  EXPECT_EQ(gpurun::fs::read_file(path("LATEST")), "new\n");
  EXPECT_EQ(entries(), std::vector<std::string>{"LATEST"});
}

TEST_F(FsFiles, ReplaceFileReadersSeeOldOrNewContentNeverAMix) {
  const std::string a(64 << 10, 'a'), b(96 << 10, 'b');
  gpurun::fs::replace_file(path("status.json"), a);
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, torn{0};
  std::thread reader([&] {
    while (!done) {
      const std::string got = gpurun::fs::read_file(path("status.json"));
      if (got != a && got != b) ++torn;
      ++reads;
    }
  });
  // The reader must be reading while the files are replaced, however late a loaded machine
  // schedules it: the writer starts after its first read, and goes on past its 100 replaces
  // until the reader has read 20 more times.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (reads.load() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int before = reads.load();
  for (int i = 0;
       i < 100 || (reads.load() < before + 20 && std::chrono::steady_clock::now() < deadline); ++i)
    gpurun::fs::replace_file(path("status.json"), i % 2 ? a : b);
  done = true;
  reader.join();
  ASSERT_GT(before, 0) << "the reader thread was not scheduled in 120 s: nothing was checked";
  ASSERT_GE(reads.load(), before + 20)
      << "the reader read " << reads.load() - before << " times in 120 s of replaces";
  EXPECT_EQ(torn.load(), 0);
  EXPECT_EQ(entries(), std::vector<std::string>{"status.json"});
}

TEST_F(FsFiles, ReplaceFileFailureKeepsTargetAndRemovesTemporary) {
  stdfs::create_directories(path("LATEST/inside"));  // rename(2) over a non-empty directory fails
  EXPECT_THROW(gpurun::fs::replace_file(path("LATEST"), "x"), IoError);
  EXPECT_TRUE(stdfs::is_directory(path("LATEST/inside")));
  EXPECT_EQ(entries(), std::vector<std::string>{"LATEST"});
}

TEST_F(FsFiles, AppendLineAddsOneNewlineTerminatedLine) {
  gpurun::fs::append_line(path("metrics.jsonl"), R"({"event":"step","global_step":1})");
  gpurun::fs::append_line(path("metrics.jsonl"), R"({"event":"step","global_step":2})");
  EXPECT_EQ(gpurun::fs::read_file(path("metrics.jsonl")),
            "{\"event\":\"step\",\"global_step\":1}\n{\"event\":\"step\",\"global_step\":2}\n");
}

TEST_F(FsFiles, ConcurrentAppendersNeverInterleaveWithinALine) {
  constexpr int kThreads = 4, kLines = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kLines; ++i) {
        gpurun::fs::append_line(path("log"), std::string(100 + t, 'a' + t) + std::to_string(i));
      }
    });
  }
  for (auto& t : threads) t.join();
  std::istringstream in(gpurun::fs::read_file(path("log")));
  std::set<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    ASSERT_GE(line.size(), 100u);
    const char c = line[0];
    const size_t run = 100 + static_cast<size_t>(c - 'a');
    ASSERT_EQ(line.find_first_not_of(c), run) << line;
    lines.insert(line);
  }
  EXPECT_EQ(lines.size(), static_cast<size_t>(kThreads * kLines));
}

TEST_F(FsFiles, RenameDurableMovesAndThrowsForMissingSource) {
  gpurun::fs::make_dirs(path("sub"));
  gpurun::fs::write_file(path("a"), "content");
  gpurun::fs::rename_durable(path("a"), path("sub/b"));
  EXPECT_FALSE(stdfs::exists(path("a")));
  EXPECT_EQ(gpurun::fs::read_file(path("sub/b")), "content");
  EXPECT_EQ(errno_of([&] { gpurun::fs::rename_durable(path("a"), path("c")); }), ENOENT);
}

TEST_F(FsFiles, SyncDirWorksOnADirectoryAndThrowsForAMissingOne) {
  EXPECT_NO_THROW(gpurun::fs::sync_dir(dir_));
  EXPECT_EQ(errno_of([&] { gpurun::fs::sync_dir(path("missing")); }), ENOENT);
}

TEST_F(FsFiles, MakeDirsCreatesNestedDirectoriesAndAcceptsExistingOnes) {
  gpurun::fs::make_dirs(path("a/b/c/"));
  EXPECT_TRUE(stdfs::is_directory(path("a/b/c")));
  EXPECT_NO_THROW(gpurun::fs::make_dirs(path("a/b/c")));
  EXPECT_NO_THROW(gpurun::fs::make_dirs(path("a")));
}

TEST_F(FsFiles, MakeDirsThroughARegularFileThrowsEnotdir) {
  gpurun::fs::write_file(path("file"), "x");
  EXPECT_EQ(errno_of([&] { gpurun::fs::make_dirs(path("file")); }), ENOTDIR);
  EXPECT_EQ(errno_of([&] { gpurun::fs::make_dirs(path("file/sub")); }), ENOTDIR);
}

TEST_F(FsFiles, RemoveAllRemovesATreeAndIgnoresAMissingPath) {
  gpurun::fs::make_dirs(path("t/u"));
  gpurun::fs::write_file(path("t/u/f"), "x");
  gpurun::fs::remove_all(path("t"));
  EXPECT_FALSE(stdfs::exists(path("t")));
  EXPECT_NO_THROW(gpurun::fs::remove_all(path("t")));
}

TEST_F(FsFiles, ExistsFileSizeAndListDir) {
  EXPECT_EQ(gpurun::fs::list_dir(path("missing")), std::vector<std::string>{});
  gpurun::fs::write_file(path("b"), "12345");
  gpurun::fs::make_dirs(path("a"));
  EXPECT_EQ(gpurun::fs::list_dir(dir_), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(gpurun::fs::exists(path("a")));
  EXPECT_FALSE(gpurun::fs::exists(path("c")));
  EXPECT_EQ(gpurun::fs::file_size(path("b")), 5);
  EXPECT_EQ(gpurun::fs::file_size(path("c")), -1);
  EXPECT_EQ(errno_of([&] { gpurun::fs::list_dir(path("b")); }), ENOTDIR);
}

TEST(FsRetry, TransientErrnosAreTheNetworkFileSystemOnes) {
  for (int err : {EIO, ESTALE, ETIMEDOUT, EINTR, EAGAIN}) {
    EXPECT_TRUE(gpurun::fs::is_transient(err)) << err;
  }
  for (int err : {0, ENOENT, EACCES, ENOSPC, EEXIST, ENOTDIR, EROFS}) {
    EXPECT_FALSE(gpurun::fs::is_transient(err)) << err;
  }
}

TEST(FsRetry, RetriesATransientErrorUntilTheOperationSucceeds) {
  int calls = 0;
  const int result = gpurun::fs::with_retries([&] {
    if (++calls < 3) throw IoError("read", "/nfs/x", EIO);
    return 42;
  });
  EXPECT_EQ(result, 42);
  EXPECT_EQ(calls, 3);
}

TEST(FsRetry, RethrowsAPermanentErrorAtOnce) {
  int calls = 0;
  EXPECT_THROW(gpurun::fs::with_retries([&] {
                 ++calls;
                 throw IoError("open", "/nfs/x", EACCES);
               }),
               IoError);
  EXPECT_EQ(calls, 1);
}

TEST(FsRetry, GivesUpAfterTheLastAttempt) {
  int calls = 0;
  try {
    gpurun::fs::with_retries(
        [&] {
          ++calls;
          throw IoError("write", "/nfs/x", ESTALE);
        },
        2);
    FAIL() << "no exception";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_number(), ESTALE);
  }
  EXPECT_EQ(calls, 2);
}

}  // namespace

static std::string slurp_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A disk that fills in the middle of an append: the file is cut back to its size before it,
// so that no half line (metrics.jsonl) or half record (a TensorBoard file) is left for the
// next append to glue itself to. A real tmpfs, filled for real (tests run as root).
TEST(FsAppend, AShortAppendOnAFullDiskLeavesTheFileAsItWas) {
  gpurun::test::TempDir dir("fs-full");
  const std::string mnt = dir.path() + "/mnt";
  std::filesystem::create_directories(mnt);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  const std::string file = mnt + "/metrics.jsonl";
  gpurun::fs::append_line(file, "{\"event\":\"plan\"}");  // its first page holds room to spare
  {
    std::ofstream filler(mnt + "/filler", std::ios::binary);
    const std::string block(4096, 'x');
    while (filler.write(block.data(), block.size())) {
    }
  }
  const std::string before = slurp_file(file);
  EXPECT_THROW(gpurun::fs::append_bytes(file, std::string(16384, 'y')), gpurun::IoError);
  EXPECT_EQ(slurp_file(file), before);
  umount2(mnt.c_str(), MNT_DETACH);
}

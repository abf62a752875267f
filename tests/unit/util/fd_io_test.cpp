// gpurun::fs's whole reads and writes on real descriptors: a pipe whose reader is slow and a
// writer interrupted by signals, files read past their end, descriptors that refuse.
#include "util/fd_io.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/temp_dir.h"

#include "gpurun/errors.h"

namespace {

using gpurun::IoError;
namespace fs = gpurun::fs;

std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 4099) & 0xff);
  return s;
}

void on_alarm(int) {}

// 8 MiB into a 64 KiB pipe: write(2) returns short counts as the reader drains it, and a
// signal handler installed without SA_RESTART interrupts it (EINTR, or a short count) hundreds
// of times. The reader must get every byte once, in order.
TEST(FdIo, WriteAllDeliversEveryByteThroughShortWritesAndSignals) {
  struct sigaction action {
  }, old{};
  action.sa_handler = on_alarm;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a blocked write returns early
  ASSERT_EQ(::sigaction(SIGUSR2, &action, &old), 0);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string sent = pattern(size_t{8} << 20);
  std::string got;
  std::thread reader([&] {
    char buf[7919];
    for (;;) {
      const ssize_t r = ::read(fds[0], buf, sizeof buf);
      if (r <= 0) break;
      got.append(buf, static_cast<size_t>(r));
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  std::atomic<bool> writing{true};
  const pthread_t writer = ::pthread_self();
  std::atomic<int> signals{0};
  std::thread interrupter([&] {
    while (writing) {
      ::pthread_kill(writer, SIGUSR2);
      ++signals;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  fs::write_all(fds[1], sent.data(), sent.size(), "the pipe");
  writing = false;
  interrupter.join();
  ::close(fds[1]);
  reader.join();
  ::close(fds[0]);
  ::sigaction(SIGUSR2, &old, nullptr);
  EXPECT_GT(signals.load(), 10);
  ASSERT_EQ(got.size(), sent.size());
  EXPECT_TRUE(got == sent);
}

TEST(FdIo, PwriteAllWritesAtItsOffsetAndPreadFullStopsAtTheEnd) {
  gpurun::test::TempDir tmp{"fd_io"};
  const std::string path = tmp.path() + "/f";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  const std::string head = pattern(5000), tail = pattern(3000);
  fs::pwrite_all(fd, tail.data(), tail.size(), 5000, path);
  fs::pwrite_all(fd, head.data(), head.size(), 0, path);
  std::string back(10000, 'x');
  EXPECT_EQ(fs::pread_full(fd, back.data(), back.size(), 0, path), 8000u);
  EXPECT_EQ(back.substr(0, 5000), head);
  EXPECT_EQ(back.substr(5000, 3000), tail);
  EXPECT_EQ(back.substr(8000), std::string(2000, 'x'));  // nothing past the end is touched
  EXPECT_EQ(fs::pread_full(fd, back.data(), 100, 8000, path), 0u);
  EXPECT_EQ(fs::pread_full(fd, back.data(), 100, 7990, path), 10u);
  ::close(fd);
}

TEST(FdIo, ADescriptorThatRefusesThrowsIoErrorNamingThePathAndErrno) {
  gpurun::test::TempDir tmp{"fd_io"};
  const std::string path = tmp.path() + "/f";
  const int read_only = ::open(path.c_str(), O_RDONLY | O_CREAT, 0644);
  ASSERT_GE(read_only, 0);
  const std::string data = "abc";
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      if (attempt == 0)
        fs::write_all(read_only, data.data(), data.size(), path);
      else
        fs::pwrite_all(read_only, data.data(), data.size(), 0, path);
      ADD_FAILURE() << "a write to a read-only descriptor did not throw";
    } catch (const IoError& e) {
      EXPECT_EQ(e.error_number(), EBADF);
      EXPECT_EQ(e.path(), path);
      EXPECT_NE(std::string(e.what()).find("write"), std::string::npos) << e.what();
    }
  }
  ::close(read_only);
  const int write_only = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(write_only, 0);
  char buf[4];
  try {
    fs::pread_full(write_only, buf, sizeof buf, 0, path);
    ADD_FAILURE() << "a read of a write-only descriptor did not throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_number(), EBADF);
    EXPECT_EQ(e.path(), path);
  }
  ::close(write_only);
}

}  // namespace

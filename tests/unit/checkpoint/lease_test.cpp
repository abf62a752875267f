// gpurun::Lease on real files, with real processes (fork) as the other holders.
#include "checkpoint/lease.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "util/clock.h"
#include <nlohmann/json.hpp>

#include "gpurun/errors.h"
#include "util/fs.h"

namespace {

namespace stdfs = std::filesystem;
using gpurun::ConfigError;
using gpurun::Lease;
using gpurun::LeaseHolder;
using Seconds = std::chrono::duration<double>;



void sleep_seconds(double s) { std::this_thread::sleep_for(Seconds(s)); }

// Seconds that `f` takes.
template <typename F>
double time_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return Seconds(std::chrono::steady_clock::now() - t0).count();
}

void write_lease(const std::string& dir, const LeaseHolder& h) {
  const nlohmann::json j = {{"host", h.host},       {"pid", h.pid},
                            {"started", h.started}, {"heartbeat", h.heartbeat},
                            {"token", h.token},     {"pid_scope", h.pid_scope}};
  gpurun::fs::replace_file(dir + "/lease.json", j.dump());
}

// A pid that was ours and is dead now: a child that exited and was reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// The next byte a child reports on `fd`, or '\0' after `timeout_s` or at end of file.
char read_report(int fd, double timeout_s) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout_s * 1000)) <= 0) return '\0';
  char c = '\0';
  return ::read(fd, &c, 1) == 1 ? c : '\0';
}

// A forked process that acquires DIR's lease (after `start_pipe`, if given, is closed) and holds
// it for `hold_s` seconds, then releases it and exits. It reports on a pipe: 'A' acquired,
// 'C' ConfigError, 'X' any other error, then 'L' once its lost() becomes true. The destructor
// kills it (SIGKILL) if it still runs, so a failed assertion leaves no process behind.
class Holder {
 public:
  Holder(const std::string& dir, double lease_timeout_s, double hold_s,
         const int* start_pipe = nullptr) {
    int fds[2];
    if (::pipe(fds) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      if (start_pipe != nullptr) {  // wait until the parent closes the write end
        ::close(start_pipe[1]);
        char c;
        while (::read(start_pipe[0], &c, 1) > 0) {
        }
      }
      report(fds[1], run(dir, lease_timeout_s, hold_s, fds[1]));
      ::_exit(0);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~Holder() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(fd_);
  }
  pid_t pid() const { return pid_; }
  char next(double timeout_s) { return read_report(fd_, timeout_s); }
  // Waits for the child to exit; true when it exited with status 0.
  bool join() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

 private:
  static void report(int fd, char c) {
    if (c != '\0' && ::write(fd, &c, 1) != 1) ::_exit(3);
  }
  static char run(const std::string& dir, double lease_timeout_s, double hold_s, int fd) {
    try {
      auto lease = Lease::acquire(dir, lease_timeout_s, false);
      report(fd, 'A');
      const auto until = std::chrono::steady_clock::now() + Seconds(hold_s);
      bool lost = false;
      while (std::chrono::steady_clock::now() < until) {
        if (!lost && lease->lost()) {
          lost = true;
          report(fd, 'L');
        }
        sleep_seconds(0.02);
      }
      lease->release();
      return '\0';
    } catch (const ConfigError&) {
      return 'C';
    } catch (...) {
      return 'X';
    }
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
};

class LeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_.path();
    dir_ = root_ + "/ckpt";
    stdfs::create_directories(dir_);
  }
  std::string lease_file() const { return dir_ + "/lease.json"; }

  gpurun::test::TempDir tmp_{"lease"};
  std::string root_;
  std::string dir_;
};

TEST(LeaseStale, FollowsTheHeartbeatAndThePidOnThisHost) {
  const double now = gpurun::unix_seconds();
  LeaseHolder h{gpurun::host_name(), ::getpid(), now - 5, now - 1, "t", ""};
  EXPECT_FALSE(gpurun::lease_is_stale(h, 60, now));  // live pid here, fresh heartbeat
  EXPECT_TRUE(gpurun::lease_is_stale(h, 0.5, now));  // heartbeat older than the timeout
  h.heartbeat = now + 1000;                          // a clock ahead of ours: not by age
  EXPECT_FALSE(gpurun::lease_is_stale(h, 60, now));

  h.heartbeat = now;
  h.pid = dead_pid();
  EXPECT_TRUE(gpurun::lease_is_stale(h, 60, now));  // dead on this host
  h.host = "some-other-host.invalid";
  EXPECT_FALSE(gpurun::lease_is_stale(h, 60, now));  // another host's pid says nothing here
  h.host = gpurun::host_name();
  h.pid_scope = "another-boot/pid:[1]";  // same hostname, other machine or container
  EXPECT_FALSE(gpurun::lease_is_stale(h, 60, now));
}

TEST_F(LeaseTest, ReadLeaseIsEmptyForAMissingOrUnparsableFile) {
  EXPECT_FALSE(gpurun::read_lease(dir_).has_value());
  gpurun::fs::write_file(lease_file(), "{not json");
  EXPECT_FALSE(gpurun::read_lease(dir_).has_value());
  gpurun::fs::write_file(lease_file(), R"({"host": "h", "pid": 12, "heartbeat": 1.5})");
  EXPECT_FALSE(gpurun::read_lease(dir_).has_value());  // no token
  gpurun::fs::write_file(lease_file(),
                         R"({"host": "h", "pid": 12, "heartbeat": 1.5, "token": "ab"})");
  const auto h = gpurun::read_lease(dir_);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->host, "h");
  EXPECT_EQ(h->pid, 12);
  EXPECT_DOUBLE_EQ(h->heartbeat, 1.5);
  EXPECT_DOUBLE_EQ(h->started, 1.5);
  EXPECT_EQ(h->token, "ab");
}

TEST_F(LeaseTest, AcquireCreatesTheDirAndWritesOurPidAndHostReleaseRemovesIt) {
  const std::string dir = root_ + "/new/ckpt";
  const double before = gpurun::unix_seconds();
  auto lease = Lease::acquire(dir, 60, false);
  const auto h = gpurun::read_lease(dir);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->pid, ::getpid());
  EXPECT_EQ(h->host, gpurun::host_name());
  EXPECT_EQ(h->token.size(), 32u);
  EXPECT_EQ(h->token, lease->holder().token);
  EXPECT_GE(h->heartbeat, before);
  EXPECT_LE(h->heartbeat, gpurun::unix_seconds());
  EXPECT_TRUE(lease->still_ours());
  EXPECT_FALSE(lease->lost());

  lease->release();
  EXPECT_FALSE(stdfs::exists(dir + "/lease.json"));
  EXPECT_FALSE(lease->still_ours());
  lease->release();  // idempotent

  auto again = Lease::acquire(dir, 60, false);
  EXPECT_NE(again->holder().token, h->token);  // a fresh token per acquisition
  again.reset();                               // the destructor releases too
  EXPECT_FALSE(stdfs::exists(dir + "/lease.json"));
}

TEST_F(LeaseTest, RejectsANonPositiveTimeout) {
  EXPECT_THROW(Lease::acquire(dir_, 0, false), ConfigError);
  EXPECT_THROW(Lease::acquire(dir_, -1, false), ConfigError);
}

TEST_F(LeaseTest, ALiveHolderMakesAcquireThrowAfterTheWaitNamingIt) {
  Holder other(dir_, 1.5, 30);
  ASSERT_EQ(other.next(10), 'A');
  const std::string their_token = gpurun::read_lease(dir_)->token;
  std::string message;
  const double waited = time_of([&] {
    try {
      Lease::acquire(dir_, 1.5, false);
    } catch (const ConfigError& e) {
      message = e.what();
    }
  });
  EXPECT_NE(message.find("pid " + std::to_string(other.pid())), std::string::npos) << message;
  EXPECT_NE(message.find("host " + gpurun::host_name()), std::string::npos) << message;
  EXPECT_NE(message.find("heartbeat"), std::string::npos) << message;
  EXPECT_GE(waited, 1.45);
  EXPECT_LT(waited, 3.0);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, their_token);  // left alone
}

TEST_F(LeaseTest, AStaleHeartbeatFromAnotherHostIsTakenAtOnce) {
  const double now = gpurun::unix_seconds();
  // A live pid, but on another host and silent for 1000 s.
  write_lease(dir_, {"some-other-host.invalid", ::getpid(), now - 2000, now - 1000, "old", ""});
  std::unique_ptr<Lease> lease;
  EXPECT_LT(time_of([&] { lease = Lease::acquire(dir_, 60, false); }), 1.0);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, lease->holder().token);
  EXPECT_EQ(gpurun::read_lease(dir_)->pid, ::getpid());
}

TEST_F(LeaseTest, ADeadPidOnThisHostIsTakenAtOnce) {
  write_lease(dir_, {gpurun::host_name(), dead_pid(), gpurun::unix_seconds(), gpurun::unix_seconds(), "dead", ""});
  std::unique_ptr<Lease> lease;
  EXPECT_LT(time_of([&] { lease = Lease::acquire(dir_, 60, false); }), 1.0);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, lease->holder().token);

  // The same with the pid scope our own leases record.
  const std::string scope = lease->holder().pid_scope;
  lease.reset();
  write_lease(dir_, {gpurun::host_name(), dead_pid(), gpurun::unix_seconds(), gpurun::unix_seconds(), "dead2", scope});
  EXPECT_LT(time_of([&] { lease = Lease::acquire(dir_, 60, false); }), 1.0);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, lease->holder().token);
}

TEST_F(LeaseTest, AnUnparsableLeaseIsTakenAtOnce) {
  gpurun::fs::write_file(lease_file(), "garbage");
  std::unique_ptr<Lease> lease;
  EXPECT_LT(time_of([&] { lease = Lease::acquire(dir_, 60, false); }), 1.0);
  EXPECT_TRUE(lease->still_ours());
}

TEST_F(LeaseTest, AHeartbeatThatNeverChangesIsStaleAfterTheWaitWhateverTheClocks) {
  // Another host whose clock runs 1000 s ahead and which died: by age the lease looks fresh
  // for 1000 s, but it did not beat once during our whole wait.
  const double now = gpurun::unix_seconds();
  write_lease(dir_, {"some-other-host.invalid", 1, now + 1000, now + 1000, "skewed", ""});
  std::unique_ptr<Lease> lease;
  const double waited = time_of([&] { lease = Lease::acquire(dir_, 0.5, false); });
  EXPECT_GE(waited, 0.45);
  EXPECT_LT(waited, 2.0);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, lease->holder().token);
}

TEST_F(LeaseTest, ForceTakesALiveLeaseAtOnceAndTheOldHolderSeesLost) {
  Holder other(dir_, 0.4, 30);  // beats every 0.1 s
  ASSERT_EQ(other.next(10), 'A');
  std::unique_ptr<Lease> lease;
  EXPECT_LT(time_of([&] { lease = Lease::acquire(dir_, 0.4, true); }), 1.0);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, lease->holder().token);
  EXPECT_EQ(gpurun::read_lease(dir_)->pid, ::getpid());

  // The old holder notices within a few of its heartbeat periods and stops writing.
  EXPECT_EQ(other.next(1.0), 'L');
  sleep_seconds(0.3);
  EXPECT_TRUE(lease->still_ours());
  EXPECT_FALSE(lease->lost());
  EXPECT_EQ(gpurun::read_lease(dir_)->token, lease->holder().token);
}

TEST_F(LeaseTest, TheHeartbeatAdvancesAndALostLeaseIsNeitherRewrittenNorRemoved) {
  auto lease = Lease::acquire(dir_, 0.4, false);  // beats every 0.1 s
  EXPECT_DOUBLE_EQ(gpurun::heartbeat_period_seconds(0.4), 0.1);
  EXPECT_DOUBLE_EQ(gpurun::heartbeat_period_seconds(60), 10);
  const double first = gpurun::read_lease(dir_)->heartbeat;
  sleep_seconds(0.35);
  const double later = gpurun::read_lease(dir_)->heartbeat;
  EXPECT_GT(later, first + 0.1);
  EXPECT_FALSE(gpurun::lease_is_stale(*gpurun::read_lease(dir_), 0.4, gpurun::unix_seconds()));
  EXPECT_NEAR(lease->holder().heartbeat, gpurun::read_lease(dir_)->heartbeat, 0.2);

  // Someone else's token appears (taken in this process, to see the thread react).
  LeaseHolder theirs = *gpurun::read_lease(dir_);
  theirs.token = "theirs";
  theirs.pid = 1;
  write_lease(dir_, theirs);
  const auto t0 = std::chrono::steady_clock::now();
  while (!lease->lost() && std::chrono::steady_clock::now() - t0 < Seconds(1)) {
    // A beat whose check-then-rename straddled our write overwrites it (last writer wins,
    // as a real taker's verification would find); write again then.
    if (gpurun::read_lease(dir_)->token != "theirs") write_lease(dir_, theirs);
    sleep_seconds(0.01);
  }
  EXPECT_TRUE(lease->lost());
  EXPECT_FALSE(lease->still_ours());
  lease->heartbeat();  // does not overwrite the new owner
  lease.reset();       // nor does the destructor remove its lease
  ASSERT_TRUE(gpurun::read_lease(dir_).has_value());
  EXPECT_EQ(gpurun::read_lease(dir_)->token, "theirs");
}

TEST_F(LeaseTest, AHolderThatReleasesDuringTheWaitHandsItOver) {
  Holder other(dir_, 5, 0.7);
  ASSERT_EQ(other.next(10), 'A');
  std::unique_ptr<Lease> lease;
  const double waited = time_of([&] { lease = Lease::acquire(dir_, 5, false); });
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 3.0);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, lease->holder().token);
  EXPECT_TRUE(other.join());
  EXPECT_TRUE(lease->still_ours());  // the old holder's release did not remove ours
}

TEST_F(LeaseTest, OfRunsStartingTogetherExactlyOneWins) {
  int start[2];
  ASSERT_EQ(::pipe(start), 0);
  std::vector<std::unique_ptr<Holder>> runs;
  for (int i = 0; i < 4; ++i) {
    runs.push_back(std::make_unique<Holder>(dir_, 1.0, 2.5, start));
  }
  ::close(start[1]);  // go
  ::close(start[0]);
  int won = 0, refused = 0, lost = 0;
  for (auto& run : runs) {
    const char c = run->next(5);
    won += c == 'A';
    refused += c == 'C';
    if (c == 'A') lost += run->next(2.3) == 'L';
  }
  EXPECT_EQ(won, 1);
  EXPECT_EQ(refused, 3);
  EXPECT_EQ(lost, 0);
}

}  // namespace

// gpurun::Lease on real files, with real processes (fork) as the other holders.
#include "checkpoint/storage/lease.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "common/temp_dir.h"
#include "util/clock.h"

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

// A lease as format 1 wrote it: host, pid, times, token and pid scope only.
LeaseHolder holder_of(const std::string& host, int64_t pid, double started, double heartbeat,
                      const std::string& token, const std::string& pid_scope) {
  LeaseHolder h;
  h.host = host;
  h.pid = pid;
  h.started = started;
  h.heartbeat = heartbeat;
  h.token = token;
  h.pid_scope = pid_scope;
  return h;
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

class LeaseDir : public ::testing::Test {
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

// The start time /proc/self/stat gives this process (field 22), as a lease records it.
int64_t own_start_ticks() {
  std::ifstream in("/proc/self/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) fields >> field;
  return std::stoll(field);
}

TEST(LeaseStale, OnThisHostOnlyTheProcessDecidesNotTheHeartbeat) {
  const double now = gpurun::unix_seconds();
  LeaseHolder h = holder_of(gpurun::host_name(), ::getpid(), now - 5, now - 1, "t", "");
  EXPECT_FALSE(gpurun::lease_is_stale(h, 60, now));  // live pid here, fresh heartbeat
  // A live holder here is never stale, whatever the reader's timeout or the heartbeat's age
  // (the issue: a run with lease_timeout=8 took over a live one that beat every 10 s).
  EXPECT_FALSE(gpurun::lease_is_stale(h, 0.5, now));
  h.heartbeat = now - 1000;
  h.timeout = 60;
  EXPECT_FALSE(gpurun::lease_is_stale(h, 8, now));
  EXPECT_TRUE(gpurun::lease_holder_alive_here(h));
  h.pid_start = own_start_ticks();  // the very process: still alive
  EXPECT_FALSE(gpurun::lease_is_stale(h, 8, now));
  h.pid_start += 12345;  // our pid, but the holder was a process that started earlier: reused
  EXPECT_TRUE(gpurun::lease_is_stale(h, 8, now));
  EXPECT_FALSE(gpurun::lease_holder_alive_here(h));

  h = holder_of(gpurun::host_name(), dead_pid(), now, now, "t", "");
  EXPECT_TRUE(gpurun::lease_is_stale(h, 60, now));  // dead on this host
  h.host = "some-other-host.invalid";
  EXPECT_FALSE(gpurun::lease_is_stale(h, 60, now));  // another host's pid says nothing here
  h.host = gpurun::host_name();
  h.pid_scope = "another-boot/pid:[1]";  // same hostname, other machine or container
  EXPECT_FALSE(gpurun::lease_is_stale(h, 60, now));
}

TEST(LeaseStale, ElsewhereTheHoldersOwnTimeoutDecidesAndOldLeasesFallBackToOurs) {
  const double now = gpurun::unix_seconds();
  LeaseHolder h = holder_of("some-other-host.invalid", 4242, now - 100, now - 30, "t", "");
  h.timeout = 60;  // beats every 10 s: 30 s of silence is within its terms
  EXPECT_FALSE(gpurun::lease_is_stale(h, 8, now));
  EXPECT_TRUE(gpurun::lease_is_stale(h, 600, now + 31));  // older than its own 60 s
  h.timeout = 0;  // a lease.json of an older gpurun: the reader's timeout stands in
  EXPECT_TRUE(gpurun::lease_is_stale(h, 8, now));
  EXPECT_FALSE(gpurun::lease_is_stale(h, 60, now));
  h.heartbeat = now + 1000;  // a clock ahead of ours: not stale by age
  EXPECT_FALSE(gpurun::lease_is_stale(h, 60, now));
}

TEST_F(LeaseDir, ReadLeaseIsEmptyForAMissingOrUnparsableFile) {
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
  // Without the fields of format 2, the holder's terms are unknown (0): readers use theirs.
  EXPECT_EQ(h->timeout, 0);
  EXPECT_EQ(h->heartbeat_period, 0);
  EXPECT_EQ(h->pid_start, 0);
  EXPECT_FALSE(h->took_over.has_value());
}

TEST_F(LeaseDir, OurLeaseRecordsItsTermsTheProcessStartAndWhomItTookOverFrom) {
  const double now = gpurun::unix_seconds();
  write_lease(dir_, holder_of("some-other-host.invalid", 4242, now - 2000, now - 1000, "old", ""));
  auto lease = Lease::acquire(dir_, 7, false);
  const auto h = gpurun::read_lease(dir_);
  ASSERT_TRUE(h.has_value());
  EXPECT_DOUBLE_EQ(h->timeout, 7);
  EXPECT_DOUBLE_EQ(h->heartbeat_period, 1.75);
  EXPECT_EQ(h->pid_start, own_start_ticks());
  ASSERT_TRUE(h->took_over.has_value());
  EXPECT_EQ(h->took_over->token, "old");
  EXPECT_FALSE(h->took_over->forced);
  EXPECT_NE(h->took_over->reason.find("heartbeat"), std::string::npos) << h->took_over->reason;
  const auto text = gpurun::fs::read_file(lease_file());
  EXPECT_EQ(nlohmann::json::parse(text)["format_version"], 2) << text;
}

TEST_F(LeaseDir, ALiveHolderOnThisHostIsNotTakenOverByAShorterTimeout) {
  // The holder's terms: 60 s, so it beats every 10 s; we wait with 0.6 s. By our timeout its
  // heartbeat is stale after 0.6 s, but its process is alive here: only --force displaces it.
  Holder other(dir_, 60, 30);
  ASSERT_EQ(other.next(10), 'A');
  const std::string their_token = gpurun::read_lease(dir_)->token;
  sleep_seconds(0.3);
  std::string message;
  const double waited = time_of([&] {
    try {
      Lease::acquire(dir_, 0.6, false);
    } catch (const ConfigError& e) {
      message = e.what();
    }
  });
  EXPECT_NE(message.find("pid " + std::to_string(other.pid())), std::string::npos) << message;
  EXPECT_GE(waited, 0.55);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, their_token);
  EXPECT_EQ(other.next(0.5), '\0') << "the holder must not lose its lease";
}

TEST_F(LeaseDir, TheDisplacedHolderIsToldWhoTookTheLeaseAndThatItWasForced) {
  auto first = Lease::acquire(dir_, 0.4, false);  // beats every 0.1 s
  auto second = Lease::acquire(dir_, 0.4, true);
  const auto t0 = std::chrono::steady_clock::now();
  while (!first->lost() && std::chrono::steady_clock::now() - t0 < Seconds(2)) sleep_seconds(0.01);
  ASSERT_TRUE(first->lost());
  const std::string why = first->trouble();
  EXPECT_NE(why.find("took it with --force"), std::string::npos) << why;
  EXPECT_NE(why.find("host " + gpurun::host_name()), std::string::npos) << why;
  EXPECT_NE(why.find("pid " + std::to_string(::getpid())), std::string::npos) << why;
  EXPECT_EQ(why.find("probably"), std::string::npos) << why;
  EXPECT_TRUE(second->still_ours());
  EXPECT_TRUE(second->trouble().empty());
}

TEST_F(LeaseDir, AHeartbeatThatCannotBeWrittenExpiresTheLeaseBeforeOthersMayTakeIt) {
  auto lease = Lease::acquire(dir_, 0.8, false);  // beats every 0.2 s
  // The directory goes away under the run and a file takes its place: every write fails.
  stdfs::rename(dir_, dir_ + ".moved");
  gpurun::fs::write_file(dir_, "not a directory");
  // The heartbeat thread meets the error when it runs, however long a loaded machine keeps it
  // waiting; until then nothing but the time since the last beat is known, and asking would
  // step down on that alone ("the storage does not answer").
  const auto t0 = std::chrono::steady_clock::now();
  while (lease->heartbeat_error().empty() && std::chrono::steady_clock::now() - t0 < Seconds(120))
    sleep_seconds(0.01);
  ASSERT_NE(lease->heartbeat_error().find("Not a directory"), std::string::npos)
      << "no heartbeat was tried in 120 s: " << lease->heartbeat_error();
  while (!lease->expired() && std::chrono::steady_clock::now() - t0 < Seconds(120))
    sleep_seconds(0.01);
  ASSERT_TRUE(lease->expired());
  EXPECT_FALSE(lease->lost());
  EXPECT_FALSE(lease->still_ours());
  const std::string why = lease->trouble();
  EXPECT_NE(why.find("expired"), std::string::npos) << why;
  EXPECT_NE(why.find("Not a directory"), std::string::npos) << why;
}

TEST_F(LeaseDir, AcquireCreatesTheDirAndWritesOurPidAndHostReleaseRemovesIt) {
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

TEST_F(LeaseDir, RejectsANonPositiveTimeout) {
  EXPECT_THROW(Lease::acquire(dir_, 0, false), ConfigError);
  EXPECT_THROW(Lease::acquire(dir_, -1, false), ConfigError);
}

TEST_F(LeaseDir, ALiveHolderMakesAcquireThrowAfterTheWaitNamingIt) {
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

TEST_F(LeaseDir, AStaleHeartbeatFromAnotherHostIsTakenAtOnce) {
  const double now = gpurun::unix_seconds();
  // A live pid, but on another host and silent for 1000 s.
  write_lease(dir_,
              holder_of("some-other-host.invalid", ::getpid(), now - 2000, now - 1000, "old", ""));
  std::unique_ptr<Lease> lease;
  EXPECT_LT(time_of([&] { lease = Lease::acquire(dir_, 60, false); }), 1.0);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, lease->holder().token);
  EXPECT_EQ(gpurun::read_lease(dir_)->pid, ::getpid());
}

TEST_F(LeaseDir, ADeadPidOnThisHostIsTakenAtOnce) {
  write_lease(dir_, holder_of(gpurun::host_name(), dead_pid(), gpurun::unix_seconds(),
                              gpurun::unix_seconds(), "dead", ""));
  std::unique_ptr<Lease> lease;
  EXPECT_LT(time_of([&] { lease = Lease::acquire(dir_, 60, false); }), 1.0);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, lease->holder().token);

  // The same with the pid scope our own leases record.
  const std::string scope = lease->holder().pid_scope;
  lease.reset();
  write_lease(dir_, holder_of(gpurun::host_name(), dead_pid(), gpurun::unix_seconds(),
                              gpurun::unix_seconds(), "dead2", scope));
  EXPECT_LT(time_of([&] { lease = Lease::acquire(dir_, 60, false); }), 1.0);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, lease->holder().token);
}

TEST_F(LeaseDir, AnUnparsableLeaseIsTakenAtOnce) {
  gpurun::fs::write_file(lease_file(), "garbage");
  std::unique_ptr<Lease> lease;
  EXPECT_LT(time_of([&] { lease = Lease::acquire(dir_, 60, false); }), 1.0);
  EXPECT_TRUE(lease->still_ours());
}

TEST_F(LeaseDir, AHeartbeatThatNeverChangesIsStaleAfterTheWaitWhateverTheClocks) {
  // Another host whose clock runs 1000 s ahead and which died: by age the lease looks fresh
  // for 1000 s, but it did not beat once during our whole wait.
  const double now = gpurun::unix_seconds();
  write_lease(dir_, holder_of("some-other-host.invalid", 1, now + 1000, now + 1000, "skewed", ""));
  std::unique_ptr<Lease> lease;
  const double waited = time_of([&] { lease = Lease::acquire(dir_, 0.5, false); });
  EXPECT_GE(waited, 0.45);
  EXPECT_LT(waited, 2.0);
  EXPECT_EQ(gpurun::read_lease(dir_)->token, lease->holder().token);
}

TEST_F(LeaseDir, ForceTakesALiveLeaseAtOnceAndTheOldHolderSeesLost) {
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

TEST_F(LeaseDir, TheHeartbeatAdvancesAndALostLeaseIsNeitherRewrittenNorRemoved) {
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

TEST_F(LeaseDir, AHolderThatReleasesDuringTheWaitHandsItOver) {
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

TEST_F(LeaseDir, OfRunsStartingTogetherExactlyOneWins) {
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

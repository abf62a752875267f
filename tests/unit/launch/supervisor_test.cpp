// gpurun::supervise on real child processes: /bin/sh scripts stand in for the gpurun binary.
#include "launch/supervisor.h"

#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <spdlog/spdlog.h>
#include "common/log_capture.h"
#include "common/temp_dir.h"
#include "util/clock.h"

#include "util/signals.h"

namespace {

namespace stdfs = std::filesystem;
using gpurun::WorkerExit;
using gpurun::test::LogCapture;
using Clock = std::chrono::steady_clock;

class SupervisorRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    gpurun::clear_stop_signal();
  }
  void TearDown() override { gpurun::clear_stop_signal(); }

  /// Options that run `script` under /bin/sh, record every exit in exits_, and append each
  /// run's GPURUN_RESTART_COUNT to DIR/runs (script may use $DIR).
  gpurun::SupervisorOptions options(const std::string& script, int max_restarts = 0) {
    gpurun::SupervisorOptions o;
    o.argv = {"/bin/sh", "-c", "echo \"$GPURUN_RESTART_COUNT\" >> \"$DIR/runs\"; " + script};
    o.env["DIR"] = dir_;
    o.max_restarts = max_restarts;
    o.backoff_initial = 0.05;
    o.backoff_max = 0.2;
    o.on_worker_exit = [this](const WorkerExit& e) { exits_.push_back(e); };
    return o;
  }

  /// The GPURUN_RESTART_COUNT of every run, in order.
  std::vector<std::string> runs() const {
    std::vector<std::string> out;
    std::ifstream in(dir_ + "/runs");
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }

  gpurun::test::TempDir tmp_{"supervisor"};
  std::string dir_;
  std::vector<WorkerExit> exits_;
};

/// Sends a stop request to the supervisor after `delay` seconds, as a signal handler would.
std::thread stop_later(double delay, int sig) {
  return std::thread([delay, sig] {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    gpurun::request_stop(sig);
  });
}

TEST(SupervisorRules, ShouldRestartOnlyRetriableExits) {
  auto exited = [](int code) {
    WorkerExit e;
    e.exit_code = code;
    return e;
  };
  EXPECT_FALSE(gpurun::should_restart(exited(0)));
  EXPECT_FALSE(gpurun::should_restart(exited(2)));
  EXPECT_FALSE(gpurun::should_restart(exited(3)));
  EXPECT_FALSE(gpurun::should_restart(exited(75)));
  EXPECT_TRUE(gpurun::should_restart(exited(1)));
  EXPECT_TRUE(gpurun::should_restart(exited(127)));
  WorkerExit killed;
  killed.signal = SIGKILL;
  EXPECT_TRUE(gpurun::should_restart(killed));
  WorkerExit hung;
  hung.hung = true;
  hung.signal = SIGKILL;
  EXPECT_TRUE(gpurun::should_restart(hung));
}

TEST(SupervisorRules, AFailureRepeatsOnlyWithTheSameCodeStepAndError) {
  WorkerExit a;
  a.exit_code = 1;
  a.step = 37;
  a.last_lines = "gpurun info step 36\ngpurun error optimizer step 38: shape [4]\n";
  EXPECT_EQ(gpurun::error_line(a), "optimizer step 38: shape [4]");
  WorkerExit b = a;
  EXPECT_TRUE(gpurun::repeats(b, a));
  b.step = 40;  // progress was made: another failure, worth a restart
  EXPECT_FALSE(gpurun::repeats(b, a));
  b = a;
  b.last_lines = "gpurun error an I/O error\n";
  EXPECT_FALSE(gpurun::repeats(b, a));
  b = a;
  b.exit_code = -1;
  b.signal = SIGKILL;  // the OOM killer may not strike twice
  EXPECT_FALSE(gpurun::repeats(b, a));
  b = a;
  b.step = -1;  // unknown step: nothing says it is the same place
  a.step = -1;
  EXPECT_FALSE(gpurun::repeats(b, a));
  WorkerExit quiet;
  quiet.exit_code = 1;
  quiet.step = 3;
  EXPECT_FALSE(gpurun::repeats(quiet, quiet));  // no error line to compare
}

TEST(SupervisorRules, DescribeNamesTheCause) {
  WorkerExit e;
  e.exit_code = 1;
  EXPECT_EQ(gpurun::describe(e), "exited with code 1");
  e.exit_code = -1;
  e.signal = SIGKILL;
  EXPECT_EQ(gpurun::describe(e), "killed by signal 9 (SIGKILL)");
  e.signal = SIGSEGV;
  EXPECT_EQ(gpurun::describe(e), "killed by signal 11 (SIGSEGV)");
  e.signal = SIGKILL;
  e.hung = true;
  e.stalled_seconds = 30.04;
  EXPECT_EQ(gpurun::describe(e), "hung: no progress for 30 s");
  EXPECT_STREQ(gpurun::state_name(gpurun::WorkerState::kHung), "hung");
}

TEST(SupervisorRules, RejectsInvalidOptions) {
  gpurun::SupervisorOptions o;
  EXPECT_THROW(gpurun::supervise(o), std::invalid_argument);  // no argv
  o.argv = {"/bin/true"};
  o.hang_timeout = 5;  // without a heartbeat file
  EXPECT_THROW(gpurun::supervise(o), std::invalid_argument);
  o.hang_timeout = 0;
  o.max_restarts = -1;
  EXPECT_THROW(gpurun::supervise(o), std::invalid_argument);
}

TEST_F(SupervisorRuns, SuccessRunsOnce) {
  EXPECT_EQ(gpurun::supervise(options("exit 0", 3)), 0);
  EXPECT_EQ(runs(), std::vector<std::string>{"0"});
  ASSERT_EQ(exits_.size(), 1u);
  EXPECT_EQ(exits_[0].exit_code, 0);
  EXPECT_EQ(exits_[0].signal, 0);
}

TEST_F(SupervisorRuns, FailuresAreRetriedWithTheRestartCountInTheEnvironment) {
  auto o = options("[ \"$GPURUN_RESTART_COUNT\" -ge 2 ] && exit 0; exit 1", 3);
  EXPECT_EQ(gpurun::supervise(o), 0);
  EXPECT_EQ(runs(), (std::vector<std::string>{"0", "1", "2"}));
  ASSERT_EQ(exits_.size(), 3u);
  EXPECT_EQ(exits_[0].exit_code, 1);
  EXPECT_EQ(exits_[1].exit_code, 1);
  EXPECT_EQ(exits_[2].exit_code, 0);
}

TEST_F(SupervisorRuns, ExtraEnvironmentReachesTheChild) {
  auto o = options("[ \"$GPURUN_TEST_EXTRA\" = 'a b=c' ] && exit 0; exit 1");
  o.env["GPURUN_TEST_EXTRA"] = "a b=c";
  EXPECT_EQ(gpurun::supervise(o), 0);
}

TEST_F(SupervisorRuns, GivesUpWithExitOneWhenRestartsAreUsedUp) {
  EXPECT_EQ(gpurun::supervise(options("exit 1", 1)), 1);
  EXPECT_EQ(runs(), (std::vector<std::string>{"0", "1"}));
}

TEST_F(SupervisorRuns, ConfigAndResumeErrorsAreNotRetried) {
  EXPECT_EQ(gpurun::supervise(options("exit 2", 3)), 2);
  EXPECT_EQ(runs().size(), 1u);
  stdfs::remove(dir_ + "/runs");
  EXPECT_EQ(gpurun::supervise(options("exit 3", 3)), 3);
  EXPECT_EQ(runs().size(), 1u);
}

TEST_F(SupervisorRuns, ExitSeventyFiveIsReturnedWithoutRestart) {
  EXPECT_EQ(gpurun::supervise(options("exit 75", 3)), 75);
  EXPECT_EQ(runs().size(), 1u);
}

TEST_F(SupervisorRuns, DeathBySignalIsRetried) {
  auto o = options("[ \"$GPURUN_RESTART_COUNT\" -ge 1 ] && exit 0; kill -9 $$", 1);
  EXPECT_EQ(gpurun::supervise(o), 0);
  ASSERT_EQ(exits_.size(), 2u);
  EXPECT_EQ(exits_[0].signal, SIGKILL);
  EXPECT_FALSE(exits_[0].hung);
  EXPECT_EQ(exits_[1].exit_code, 0);
}

TEST_F(SupervisorRuns, HungWorkerIsKilledAndRestarted) {
  // `sleep` runs as a grandchild holding the stderr pipe: the whole process group must die.
  auto o = options("[ \"$GPURUN_RESTART_COUNT\" -ge 1 ] && exit 0; sleep 30; exit 0", 1);
  o.hang_timeout = 1;
  o.progress_file = dir_ + "/heartbeat";  // never written
  const auto start = Clock::now();
  EXPECT_EQ(gpurun::supervise(o), 0);
  EXPECT_LT(gpurun::seconds_since(start), 4.0);
  ASSERT_EQ(exits_.size(), 2u);
  EXPECT_TRUE(exits_[0].hung);
  EXPECT_EQ(exits_[0].signal, SIGKILL);
  EXPECT_GE(exits_[0].seconds, 1.0);
  EXPECT_LT(exits_[0].seconds, 2.0);
  EXPECT_GE(exits_[0].stalled_seconds, 1.0);
  EXPECT_FALSE(exits_[1].hung);
}

TEST_F(SupervisorRuns, HeartbeatKeepsASlowWorkerAlive) {
  // Runs 1.5 s with hang_timeout 0.5 s, touching the heartbeat every 0.1 s.
  auto o = options(
      "i=0; while [ $i -lt 15 ]; do touch \"$DIR/heartbeat\"; sleep 0.1; "
      "i=$((i+1)); done; exit 0");
  o.hang_timeout = 0.5;
  o.progress_file = dir_ + "/heartbeat";
  EXPECT_EQ(gpurun::supervise(o), 0);
  ASSERT_EQ(exits_.size(), 1u);
  EXPECT_FALSE(exits_[0].hung);
  EXPECT_GE(exits_[0].seconds, 1.4);
}

TEST_F(SupervisorRuns, StaleOrFutureDatedHeartbeatDoesNotCount) {
  // A heartbeat left by an earlier run, dated an hour ahead (a file server's clock): only a
  // change seen during this run is progress, so the hang is still caught.
  const std::string heartbeat = dir_ + "/heartbeat";
  std::ofstream(heartbeat) << "";
  timeval times[2] = {{::time(nullptr) + 3600, 0}, {::time(nullptr) + 3600, 0}};
  ASSERT_EQ(::utimes(heartbeat.c_str(), times), 0);
  auto o = options("exec sleep 30");
  o.hang_timeout = 0.5;
  o.progress_file = heartbeat;
  const auto start = Clock::now();
  EXPECT_EQ(gpurun::supervise(o), 1);
  EXPECT_LT(gpurun::seconds_since(start), 2.0);
  ASSERT_EQ(exits_.size(), 1u);
  EXPECT_TRUE(exits_[0].hung);
}

TEST_F(SupervisorRuns, BackoffDoublesUntilARunMakesProgress) {
  auto o = options("exit 1", 3);
  o.backoff_initial = 0.1;
  o.backoff_max = 0.3;
  {
    LogCapture log;
    EXPECT_EQ(gpurun::supervise(o), 1);
    const std::string text = log.text();
    EXPECT_NE(text.find("restart 0/3; restarting in 0.1 s"), std::string::npos) << text;
    EXPECT_NE(text.find("restart 1/3; restarting in 0.2 s"), std::string::npos) << text;
    EXPECT_NE(text.find("restart 2/3; restarting in 0.3 s"), std::string::npos) << text;
  }
  // A run whose heartbeat advanced is not a crash loop: the delay starts over.
  o = options("echo beat >> \"$DIR/heartbeat\"; exit 1", 2);
  o.backoff_initial = 0.1;
  o.progress_file = dir_ + "/heartbeat";
  LogCapture log;
  EXPECT_EQ(gpurun::supervise(o), 1);
  const std::string text = log.text();
  EXPECT_NE(text.find("restart 0/2; restarting in 0.1 s"), std::string::npos) << text;
  EXPECT_NE(text.find("restart 1/2; restarting in 0.1 s"), std::string::npos) << text;
}

TEST_F(SupervisorRuns, FailureReportHoldsTheLastStderrLines) {
  // 30 lines, the last of them ended by '\r' only (an in-place progress line), then a crash.
  auto o = options(
      "i=10; while [ $i -lt 39 ]; do echo \"line-$i\" >&2; i=$((i+1)); done; "
      "printf 'line-39\\r' >&2; exit 1");
  LogCapture log;
  EXPECT_EQ(gpurun::supervise(o), 1);
  ASSERT_EQ(exits_.size(), 1u);
  std::string expected;
  for (int i = 20; i < 40; ++i) expected += (i == 20 ? "" : "\n") + ("line-" + std::to_string(i));
  EXPECT_EQ(exits_[0].last_lines, expected);
  const std::string text = log.text();
  EXPECT_NE(text.find("exited with code 1"), std::string::npos) << text;
  EXPECT_NE(text.find("giving up"), std::string::npos) << text;
  EXPECT_NE(text.find("  | line-20\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  | line-39"), std::string::npos) << text;
  EXPECT_EQ(text.find("line-19"), std::string::npos) << text;
}

// Issue 40, item 5: rank 1 has a data error (exit 2) and takes a while to exit after it, its
// report written after rank 0 failed; rank 0's collective fails meanwhile (exit 1, its error
// report says a peer failed) and is reaped first. The root cause is rank 1's error, with its
// stderr, never retried; rank 0's reaction is not blamed. Each worker writes its report where
// GPURUN_ERROR_FILE says, as gpurun's main does, and rank 1 outlives the SIGTERM the others get
// (gpurun's handler only asks for a stop), as a rank in its error path does.
TEST_F(SupervisorRuns, TheFirstFailureThatIsNotAReactionToAPeerIsTheRootCause) {
  const std::string report =
      "printf '{\"time\": %s, \"exit_code\": %s, \"message\": \"m\", \"peer_failure\": %s}' "
      "\"$(date +%s.%N)\" ";
  auto o = options(
      "if [ \"$ROLE\" = 0 ]; then sleep 0.2; echo 'gpurun error all-reduce failed: Connection "
      "closed by peer' >&2; " +
          report +
          "1 true > \"$GPURUN_ERROR_FILE\"; exit 1; fi; trap '' TERM; sleep 0.1; echo 'gpurun "
          "error "
          "token id 300 is not below the vocabulary size' >&2; sleep 0.4; " +
          report + "2 false > \"$GPURUN_ERROR_FILE\"; exit 2",
      2);
  o.workers = {{{{"ROLE", "0"}}, "rank 0", ""}, {{{"ROLE", "1"}}, "rank 1", ""}};
  o.stop_timeout = 5;
  LogCapture log;
  EXPECT_EQ(gpurun::supervise(o), 2);
  ASSERT_EQ(exits_.size(), 1u);  // not retried
  EXPECT_EQ(exits_[0].name, "rank 1");
  EXPECT_EQ(exits_[0].exit_code, 2);
  const std::string text = log.text();
  EXPECT_NE(text.find("rank 1 failed first: exited with code 2"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 exited with code 2 (usage or config error); not retried"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  | gpurun error token id 300"), std::string::npos) << text;
  EXPECT_EQ(runs().size(), 2u);  // both workers of one run
}

// Without reports (every rank's collectives failed, or no report was written), the first
// failure reaped stays the root cause; a worker the supervisor killed is never it.
TEST(SupervisorRules, RootCauseWithoutReportsIsTheFirstReapedAndNeverOneWeKilled) {
  std::vector<WorkerExit> exits(3);
  exits[0].exit_code = 1;
  exits[0].failed_at = 10;
  exits[0].peer_failure = true;
  exits[1].exit_code = 1;
  exits[1].failed_at = 11;
  exits[1].peer_failure = true;
  exits[2].exit_code = -1;
  exits[2].signal = SIGKILL;
  exits[2].stopped = true;
  exits[2].failed_at = 9;
  EXPECT_EQ(gpurun::root_cause_of(exits, 0), 0);
  // A report of its own, not a reaction: the earliest such.
  exits[1].peer_failure = false;
  EXPECT_EQ(gpurun::root_cause_of(exits, 0), 1);
  // Asked to stop, it exited with an error of its own (not killed): it counts.
  exits[2] = WorkerExit{};
  exits[2].exit_code = 2;
  exits[2].stopped = true;
  exits[2].failed_at = 10.5;
  EXPECT_EQ(gpurun::root_cause_of(exits, 0), 2);
  // Successes and stops are not failures.
  std::vector<WorkerExit> fine(2);
  fine[0].exit_code = 0;
  fine[1].exit_code = 75;
  EXPECT_EQ(gpurun::root_cause_of(fine, -1), -1);
}

TEST_F(SupervisorRuns, ReportNamesTheStepInTheHeartbeatWhenTheWorkerExited) {
  // A lone worker's heartbeat is the progress file; it is read once the worker is reaped, so
  // its last beat (written as it stops) is the step reported, not an earlier one.
  auto o = options(
      "echo 'step 1' > \"$DIR/heartbeat\"; sleep 0.2; echo 'step 9' > \"$DIR/heartbeat\"; "
      "exit 75");
  o.progress_file = dir_ + "/heartbeat";
  LogCapture log;
  EXPECT_EQ(gpurun::supervise(o), 75);
  ASSERT_EQ(exits_.size(), 1u);
  EXPECT_EQ(exits_[0].step, 9);
  EXPECT_NE(log.text().find("worker exited with code 75 at step 9 (stopped by a signal)"),
            std::string::npos)
      << log.text();
}

// A heartbeat left by an earlier run (a rank SIGKILLed at step 50) is not this run's: a worker
// that fails before its first step, at a config check, is reported without a step.
TEST_F(SupervisorRuns, AHeartbeatLeftByAnEarlierRunNamesNoStep) {
  std::ofstream(dir_ + "/heartbeat") << "step 50\n";
  auto o = options("echo 'gpurun error train.batch_size 64 must be divisible' >&2; exit 2");
  o.progress_file = dir_ + "/heartbeat";
  LogCapture log;
  EXPECT_EQ(gpurun::supervise(o), 2);
  ASSERT_EQ(exits_.size(), 1u);
  EXPECT_EQ(exits_[0].step, -1);
  EXPECT_EQ(log.text().find("at step 50"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("worker exited with code 2"), std::string::npos) << log.text();
}

TEST_F(SupervisorRuns, StopSignalIsForwardedAndNotRestarted) {
  auto o = options("trap 'exit 75' TERM; while true; do sleep 0.1; done", 3);
  std::thread stopper = stop_later(0.5, SIGTERM);
  const auto start = Clock::now();
  EXPECT_EQ(gpurun::supervise(o), 75);
  stopper.join();
  EXPECT_LT(gpurun::seconds_since(start), 2.0);
  EXPECT_EQ(runs().size(), 1u);
  ASSERT_EQ(exits_.size(), 1u);
  EXPECT_EQ(exits_[0].exit_code, 75);
}

TEST_F(SupervisorRuns, InterruptIsForwardedAsTerminate) {
  // A child that saw SIGINT directly (a scheduler signalling the whole job) and then ours would
  // read two interrupts as "stop without saving"; SIGTERM is forwarded instead.
  auto o = options("trap 'exit 75' TERM; trap 'exit 1' INT; while true; do sleep 0.1; done", 3);
  std::thread stopper = stop_later(0.3, SIGINT);
  EXPECT_EQ(gpurun::supervise(o), 75);
  stopper.join();
  EXPECT_EQ(runs().size(), 1u);
}

TEST_F(SupervisorRuns, StopSignalDuringBackoffEndsWithoutRestart) {
  auto o = options("exit 1", 3);
  o.backoff_initial = 10;
  o.backoff_max = 10;
  std::thread stopper = stop_later(0.5, SIGUSR1);
  const auto start = Clock::now();
  EXPECT_EQ(gpurun::supervise(o), 75);
  stopper.join();
  EXPECT_LT(gpurun::seconds_since(start), 2.0);
  EXPECT_EQ(runs().size(), 1u);
}

TEST_F(SupervisorRuns, MissingBinaryIsNotRetried) {
  auto o = options("exit 0", 3);
  o.argv = {dir_ + "/no-such-gpurun", "run.yaml"};
  EXPECT_EQ(gpurun::supervise(o), 1);
  EXPECT_TRUE(exits_.empty());
}

}  // namespace

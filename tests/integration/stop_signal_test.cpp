// A stop signal at any moment of a run's start (issue 45, item 2): LibTorch's libraries take most
// of a second to initialise on a loaded machine, and a SIGTERM then killed the process with 143
// and nothing said, which Slurm's requeue on 75 took for the end of the job.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"

using namespace gpurun::test;

namespace {

/// Whether `pid` blocks or catches SIGTERM (/proc/PID/status: SigBlk, SigCgt), that is whether
/// gpurun's own code runs: from its .preinit_array on, before its libraries' initializers.
bool gpurun_code_runs(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  const unsigned long long term = 1ull << (SIGTERM - 1);
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigBlk:", 0) != 0 && line.rfind("SigCgt:", 0) != 0) continue;
    if (std::stoull(line.substr(line.find(':') + 1), nullptr, 16) & term) return true;
  }
  return false;
}

/// Two threads that spin while alive: the machine is busy, as a shared node is.
class BusyMachine {
 public:
  BusyMachine() {
    for (int i = 0; i < 2; ++i)
      threads_.emplace_back([this] {
        volatile unsigned long x = 0;
        while (!stop_.load(std::memory_order_relaxed)) x = x + 1;
      });
  }
  ~BusyMachine() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

}  // namespace

// SIGTERM at moments spread over the first 2 s after gpurun's own code starts (the dynamic
// loader's relocation before it, 10-40 ms, is the one window a signal still kills: the examples
// requeue on 143 too): start-up, the memory probe, the first steps. Every run exits 75 saying
// so, and a stopped run resumes to the end. Each step pauses 20 ms, so the 300 steps last 6 s
// at least: a fast machine must not finish the run before the latest signal lands.
TEST(StopSignal, ASigtermAtAnyMomentOfStartUpExits75) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(6000, 60, 3));
  std::mt19937 draw(45);
  constexpr int kRuns = 10;
  BusyMachine busy;
  for (int i = 0; i < kRuns; ++i) {
    const double delay = (i + std::uniform_real_distribution<double>(0, 1)(draw)) * 2.0 / kRuns;
    SCOPED_TRACE("SIGTERM " + std::to_string(delay) + " s after gpurun's code started");
    const std::string ckpt = dir / ("run" + std::to_string(i));
    const std::string log = dir / ("log" + std::to_string(i));
    const pid_t pid =
        start_gpurun({config, "--ckpt", ckpt}, log, {{"GPURUN_FAULT", "sleep20:after_step:*"}});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!gpurun_code_runs(pid) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    ASSERT_EQ(kill(pid, SIGTERM), 0);
    const Result r = wait_gpurun(pid, log, 120);
    EXPECT_EQ(r.signal, 0) << r.err;
    EXPECT_EQ(r.exit_code, 75) << r.err;
    EXPECT_TRUE(contains(r.err, "SIGTERM")) << r.err;
    if (i == kRuns - 1) {
      const Result resumed = run_gpurun({config, "--ckpt", ckpt, "--resume"});
      EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
    }
  }
}

// A SIGTERM while the libraries run their initializers (a preloaded one raises it), before
// main(): it waits, blocked since the binary's .preinit_array, and is taken once the handlers
// are in. Before, the process died by it (143) with nothing said.
TEST(StopSignal, ASigtermWhileItsLibrariesInitialiseExits75) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 1));
  const std::string preload = (std::filesystem::path(GPURUN_BINARY).parent_path().parent_path() /
                               "tests" / "libgpurun_test_raise_sigterm.so")
                                  .string();
  ASSERT_TRUE(std::filesystem::exists(preload)) << preload;
  const Result r = run_gpurun({config, "--ckpt", dir / "ckpt"}, {{"LD_PRELOAD", preload}});
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGTERM")) << r.err;
  const Result resumed = run_gpurun({config, "--ckpt", dir / "ckpt", "--resume"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
}

// A run waiting for the lease of a live one (its heartbeat every second of a 30 s timeout)
// stops at a SIGTERM with 75 within a poll of the lease, not at the wait's end with 2.
TEST(StopSignal, ASigtermDuringALeaseWaitExits75AtOnce) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 1));
  const pid_t holder = start_gpurun({config, "--ckpt", dir / "ckpt", "--set",
                                     "checkpoint.lease_timeout=30", "--set", "train.epochs=50"},
                                    dir / "holder", {{"GPURUN_FAULT", "sleep300:after_step:*"}});
  ASSERT_TRUE(wait_for_step(dir / "ckpt", 1, holder)) << slurp(dir / "holder.err");
  const pid_t waiting = start_gpurun(
      {config, "--ckpt", dir / "ckpt", "--resume", "--set", "checkpoint.lease_timeout=30"},
      dir / "waiting");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!contains(slurp(dir / "waiting.err"), "waiting up to") &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(contains(slurp(dir / "waiting.err"), "waiting up to")) << slurp(dir / "waiting.err");
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(waiting, SIGTERM), 0);
  const Result r = wait_gpurun(waiting, dir / "waiting", 120);
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGTERM")) << r.err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 25.0)
      << "stopped at the wait's end, not at the signal";
  kill(holder, SIGKILL);
  EXPECT_EQ(wait_gpurun(holder, dir / "holder").signal, SIGKILL);
}

// `--slurm-signal B:URG@90` (a job whose --signal is one gpurun does not stop on by default):
// SIGURG, whose default action is to be ignored, saves and exits 75, in a single process and
// through a supervisor, which forwards it to its worker as SIGTERM.
TEST(StopSignal, ASlurmSignalOutsideTheDefaultsStopsTheRunWhenNamed) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(6000, 60, 3));
  for (const bool supervised : {false, true}) {
    SCOPED_TRACE(supervised ? "with --max-restarts 1" : "a single process");
    const std::string ckpt = dir / (supervised ? "supervised" : "single");
    const std::string log = dir / (supervised ? "log-supervised" : "log-single");
    std::vector<std::string> args{config, "--ckpt", ckpt, "--slurm-signal", "B:URG@90"};
    if (supervised) args.insert(args.end(), {"--max-restarts", "1"});
    const pid_t pid = start_gpurun(args, log, {{"GPURUN_FAULT", "sleep20:after_step:*"}});
    ASSERT_TRUE(wait_for_step(ckpt, 3, pid, 120)) << slurp(log + ".err");
    ASSERT_EQ(kill(pid, SIGURG), 0);
    const Result r = wait_gpurun(pid, log, 120);
    EXPECT_EQ(r.exit_code, 75) << r.err;
    const auto signals = events(ckpt, "signal");
    ASSERT_EQ(signals.size(), 1u) << r.err;
    EXPECT_EQ(signals[0].value("signal", 0), supervised ? SIGTERM : SIGURG);
  }
  // A signal gpurun cannot stop on is refused before anything runs.
  const Result bad = run_gpurun({config, "--ckpt", dir / "bad", "--slurm-signal", "KILL"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
}

// The checkpoint directory's lease between real gpurun processes (issue 16): a live run on
// this host is never taken over by another run's shorter lease_timeout, only by --force, and
// the displaced run says who took the lease and how.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

std::string this_host() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

/// Waits until `ckpt`/lease.json exists or `seconds` pass; true in the first case.
bool wait_for_lease(const std::string& ckpt, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::filesystem::exists(ckpt + "/lease.json")) return true;
    sleep_for(0.01);
  }
  return false;
}

// A run that is slowed down to stay alive, with the default lease_timeout (60 s: it beats every
// 10 s), until the test stops it with SIGTERM.
const Env kSlow{{"GPURUN_FAULT", "sleep300:after_step:*"}};

TEST(LeaseTakeover, ALiveRunIsNotTakenOverByARunWithAShorterLeaseTimeout) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 50));  // 1000 steps
  const std::string ckpt = dir / "ckpt";
  pid_t first = start_gpurun({config, "--ckpt", ckpt}, dir / "first", kSlow);
  ASSERT_TRUE(wait_for_lease(ckpt, 120)) << slurp(dir / "first.err");
  // Its heartbeat is now older than the second run's timeout will allow, by the second's terms.
  sleep_for(1.0);
  Result second =
      run_gpurun({config, "--ckpt", ckpt, "--resume", "--set", "checkpoint.lease_timeout=3"});
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_TRUE(contains(second.err, "pid " + std::to_string(first))) << second.err;
  EXPECT_FALSE(contains(second.err, "taking over")) << second.err;
  EXPECT_FALSE(contains(second.err, "resuming from")) << second.err;

  // The first run kept its lease and trains on until it is stopped.
  kill(first, SIGTERM);
  Result r = wait_gpurun(first, dir / "first");
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_FALSE(contains(r.err, "lost the lease")) << r.err;
}

TEST(LeaseTakeover, ForceDisplacesALiveRunWhichSaysWhoTookItAndHow) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 50));
  const std::string ckpt = dir / "ckpt";
  pid_t first = start_gpurun({config, "--ckpt", ckpt, "--set", "checkpoint.every_steps=5"},
                             dir / "first", kSlow);
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt, first, "")) << slurp(dir / "first.err");
  pid_t second = start_gpurun(
      {config, "--ckpt", ckpt, "--resume", "--force", "--set", "checkpoint.every_steps=5"},
      dir / "second", kSlow);
  // The displaced run stops at its next step without saving, and says what happened.
  Result old = wait_gpurun(first, dir / "first");
  EXPECT_EQ(old.exit_code, 2) << old.err;
  EXPECT_TRUE(contains(old.err, "lost the lease of " + ckpt)) << old.err;
  EXPECT_TRUE(contains(
      old.err, "host " + this_host() + ", pid " + std::to_string(second) + " took it with --force"))
      << old.err;
  EXPECT_FALSE(contains(old.err, "probably")) << old.err;
  EXPECT_TRUE(contains(old.err, "Stopping without saving")) << old.err;
  EXPECT_TRUE(contains(old.err, "the newest complete checkpoint is " + ckpt + "/ckpt-")) << old.err;

  kill(second, SIGTERM);
  Result r = wait_gpurun(second, dir / "second");
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_TRUE(contains(r.err, "--force: taking the lease")) << r.err;
}

}  // namespace
}  // namespace gpurun::test

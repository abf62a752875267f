// gpurun::Reporter's heartbeat on real files: what the launcher reads for the step a rank
// reached (supervisor.h).
#include "report/reporter.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "common/temp_dir.h"

namespace {

using gpurun::heartbeat_path;
using gpurun::read_heartbeat_step;
using gpurun::Reporter;

// The throttle skips the second step (within a second of the first); the rank's exit must
// still leave it in the file, for the launcher's report.
TEST(Reporter, HeartbeatHoldsTheLastStepOnceTheReporterIsGone) {
  gpurun::test::TempDir dir("reporter");
  {
    Reporter reporter(dir.path(), true, 0);
    reporter.heartbeat(1);
    reporter.heartbeat(2);
  }
  EXPECT_EQ(read_heartbeat_step(heartbeat_path(dir.path(), 0)), 2);
}

// A stop or a save is announced by an event, on every rank: the heartbeat catches up then,
// before the save or the exit.
TEST(Reporter, AnEventBringsTheHeartbeatUpToDateOnEveryRank) {
  gpurun::test::TempDir dir("reporter");
  Reporter reporter(dir.path(), false, 1);
  reporter.heartbeat(7);
  reporter.heartbeat(8);
  reporter.event("signal", {{"signal", 15}, {"global_step", 8}});
  EXPECT_EQ(read_heartbeat_step(heartbeat_path(dir.path(), 1)), 8);
  EXPECT_FALSE(std::filesystem::exists(dir / "metrics.jsonl"));  // rank 1 writes no metrics
}

TEST(Reporter, NoHeartbeatBeforeTheFirstStep) {
  gpurun::test::TempDir dir("reporter");
  {
    Reporter reporter(dir.path(), true, 0);
    reporter.event("plan", nlohmann::json::object());
  }
  EXPECT_FALSE(std::filesystem::exists(heartbeat_path(dir.path(), 0)));
  EXPECT_EQ(read_heartbeat_step(heartbeat_path(dir.path(), 0)), -1);
}

// A rank killed outright (SIGKILL) while it rewrites its heartbeat leaves the step it reached or
// the one before, never an empty or torn file: the launcher's report names the step. The child
// rewrites the file as fast as it can (an event flushes the heartbeat past its throttle) and is
// killed at random moments.
TEST(Reporter, ASigkillWhileTheHeartbeatIsRewrittenLeavesAStep) {
  std::mt19937 random(11);
  for (int round = 0; round < 40; ++round) {
    gpurun::test::TempDir dir("reporter");
    const std::string file = heartbeat_path(dir.path(), 1);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      Reporter reporter(dir.path(), false, 1);
      for (int64_t step = 1;; ++step) {
        reporter.heartbeat(step);
        reporter.event("checkpoint", {{"global_step", step}});
      }
    }
    while (!std::filesystem::exists(file))
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 3000));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    std::ifstream in(file);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_GE(read_heartbeat_step(file), 1)
        << "round " << round << ": the heartbeat holds \"" << text << "\"";
  }
}

}  // namespace

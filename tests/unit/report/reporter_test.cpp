// gpurun::Reporter's heartbeat on real files: what the launcher reads for the step a rank
// reached (supervisor.h).
#include "report/reporter.h"

#include <filesystem>

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

}  // namespace

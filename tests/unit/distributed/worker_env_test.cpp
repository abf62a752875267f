// Unit tests of worker_env: the torchrun worker variables and the launcher's resolution from
// flags and MASTER_* (Slurm's variables: tests/unit/launch/slurm_test.cpp).
#include <gtest/gtest.h>

#include "distributed/worker_env.h"
#include "gpurun/errors.h"

namespace gpurun {
namespace {

TEST(DistEnv, NoWorldSizeIsASingleProcess) {
  EXPECT_FALSE(worker_env({{"RANK", "0"}}).has_value());
}

TEST(DistEnv, TorchrunVariablesGiveTheWorkersPlace) {
  const auto d = worker_env({{"RANK", "3"},
                             {"LOCAL_RANK", "1"},
                             {"WORLD_SIZE", "4"},
                             {"LOCAL_WORLD_SIZE", "2"},
                             {"MASTER_ADDR", "node7"},
                             {"MASTER_PORT", "29400"}});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rank, 3);
  EXPECT_EQ(d->local_rank, 1);
  EXPECT_EQ(d->world_size, 4);
  EXPECT_EQ(d->local_world_size, 2);
  EXPECT_EQ(d->master_addr, "node7");
  EXPECT_EQ(d->master_port, 29400);
}

TEST(DistEnv, InconsistentVariablesNameTheVariable) {
  try {
    worker_env({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
    FAIL() << "RANK 4 of 4 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK must be in 0..3, got 4"), std::string::npos);
  }
  EXPECT_THROW(worker_env({{"WORLD_SIZE", "2"}}), ConfigError);  // RANK missing
  EXPECT_THROW(worker_env({{"RANK", "x"}, {"WORLD_SIZE", "2"}}), ConfigError);
  EXPECT_THROW(worker_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
               ConfigError);
}

TEST(DistEnv, LauncherGivesConsecutiveRanksPerNode) {
  LaunchSpec spec;
  spec.nproc_per_node = 4;
  spec.nnodes = 2;
  spec.node_rank = 1;
  spec.master_addr = "10.0.0.1";
  spec.master_port = 29501;
  const Environment v = worker_variables(spec, 2);
  EXPECT_EQ(v.at("RANK"), "6");
  EXPECT_EQ(v.at("LOCAL_RANK"), "2");
  EXPECT_EQ(v.at("WORLD_SIZE"), "8");
  EXPECT_EQ(v.at("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(v.at("MASTER_ADDR"), "10.0.0.1");
  EXPECT_EQ(v.at("MASTER_PORT"), "29501");
}

TEST(DistEnv, FlagsWinOverMasterVariablesOverDefaults) {
  LaunchFlags flags;
  EXPECT_EQ(resolve_launch(flags, {}).master_addr, "127.0.0.1");
  EXPECT_EQ(resolve_launch(flags, {{"MASTER_PORT", "1234"}}).master_port, 1234);
  flags.master_port = 4321;
  flags.nnodes = 2;
  flags.node_rank = 1;
  const LaunchSpec s = resolve_launch(flags, {{"MASTER_PORT", "1234"}});
  EXPECT_EQ(s.master_port, 4321);
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.node_rank, 1);
  flags.node_rank = 2;
  EXPECT_THROW(resolve_launch(flags, {}), ConfigError);
}

}  // namespace
}  // namespace gpurun

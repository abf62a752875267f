// Unit tests of dist_env: the torchrun worker variables, the launcher's resolution from flags,
// MASTER_* and Slurm, and Slurm's host-list and tasks-per-node formats.
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

// `srun --ntasks-per-node=1 gpurun --nproc-per-node 4 ...` on 3 nodes: each task launches.
TEST(DistEnv, SlurmOneTaskPerNodeMakesEachTaskTheLauncherOfItsNode) {
  const Environment slurm{{"SLURM_JOB_ID", "123456"},
                          {"SLURM_PROCID", "2"},
                          {"SLURM_NTASKS", "3"},
                          {"SLURM_JOB_NUM_NODES", "3"},
                          {"SLURM_NODEID", "2"},
                          {"SLURM_LOCALID", "0"},
                          {"SLURM_JOB_NODELIST", "gpu[07-09]"},
                          {"SLURM_TASKS_PER_NODE", "1(x3)"}};
  EXPECT_FALSE(slurm_runs_workers(slurm));
  LaunchFlags flags;
  flags.nproc_per_node = 4;
  const LaunchSpec s = resolve_launch(flags, slurm);
  EXPECT_EQ(s.nnodes, 3);
  EXPECT_EQ(s.node_rank, 2);
  EXPECT_EQ(s.master_addr, "gpu07");
  EXPECT_EQ(s.master_port, 20000 + 123456 % 10000);
  EXPECT_EQ(worker_variables(s, 3).at("RANK"), "11");
  EXPECT_EQ(worker_variables(s, 3).at("WORLD_SIZE"), "12");
}

// `srun --ntasks-per-node=2 gpurun ...` on 2 nodes: each task is a worker.
TEST(DistEnv, SlurmSeveralTasksPerNodeMakesEachTaskAWorker) {
  const Environment slurm{{"SLURM_JOB_ID", "77"},
                          {"SLURM_PROCID", "3"},
                          {"SLURM_NTASKS", "4"},
                          {"SLURM_NNODES", "2"},
                          {"SLURM_NODEID", "1"},
                          {"SLURM_LOCALID", "1"},
                          {"SLURM_STEP_NODELIST", "a1,b2"},
                          {"SLURM_TASKS_PER_NODE", "2(x2)"},
                          {"MASTER_PORT", "29999"}};
  ASSERT_TRUE(slurm_runs_workers(slurm));
  const Environment v = worker_env_from_slurm(slurm);
  const auto d = worker_env(v);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rank, 3);
  EXPECT_EQ(d->local_rank, 1);
  EXPECT_EQ(d->world_size, 4);
  EXPECT_EQ(d->local_world_size, 2);
  EXPECT_EQ(d->master_addr, "a1");
  EXPECT_EQ(d->master_port, 29999);
}

TEST(DistEnv, SlurmHostListsAndTasksPerNode) {
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("node1,node2"), "node1");
  EXPECT_EQ(first_slurm_host("gpu[007-009,012],cpu1"), "gpu007");
  EXPECT_EQ(first_slurm_host("n[3,5]-ib"), "n3-ib");
  EXPECT_EQ(first_slurm_host("cpu1,gpu[1-2]"), "cpu1");
  EXPECT_THROW(first_slurm_host(""), ConfigError);
  EXPECT_THROW(first_slurm_host("gpu[1-2"), ConfigError);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_THROW(slurm_tasks_on_node("2(x3),1", 4), ConfigError);
  EXPECT_THROW(slurm_tasks_on_node("x", 0), ConfigError);
}

}  // namespace
}  // namespace gpurun

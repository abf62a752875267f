// Unit tests of launch/slurm: a step's variables turned into the launch and the workers' places,
// the host-list and tasks-per-node formats, --signal's syntax, the batch script's #SBATCH
// --signal, the job's check at the start, and the scontrol-style command runner.
#include "launch/slurm.h"

#include <gtest/gtest.h>

#include <csignal>

#include "gpurun/errors.h"
#include "launch/worker_process.h"
#include "train/scheduler_job.h"

namespace gpurun {
namespace {

// `srun --ntasks-per-node=1 gpurun --nproc-per-node 4 ...` on 3 nodes: each task launches.
TEST(SlurmEnv, SlurmOneTaskPerNodeMakesEachTaskTheLauncherOfItsNode) {
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
  const LaunchSpec s = resolve_launch(with_slurm_launch(flags, slurm), slurm);
  EXPECT_EQ(s.nnodes, 3);
  EXPECT_EQ(s.node_rank, 2);
  EXPECT_EQ(s.master_addr, "gpu07");
  EXPECT_EQ(s.master_port, 20000 + 123456 % 10000);
  EXPECT_EQ(worker_variables(s, 3).at("RANK"), "11");
  EXPECT_EQ(worker_variables(s, 3).at("WORLD_SIZE"), "12");
}

// `srun --ntasks-per-node=2 gpurun ...` on 2 nodes: each task is a worker.
TEST(SlurmEnv, SlurmSeveralTasksPerNodeMakesEachTaskAWorker) {
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

TEST(SlurmEnv, SlurmHostListsAndTasksPerNode) {
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

TEST(SlurmEnv, CommandLineFlagsAndMasterVariablesWinOverTheStep) {
  const Environment slurm{{"SLURM_JOB_ID", "5"},      {"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "2"},      {"SLURM_JOB_NUM_NODES", "2"},
                          {"SLURM_NODEID", "1"},      {"SLURM_JOB_NODELIST", "n[1-2]"},
                          {"MASTER_ADDR", "10.0.0.9"}};
  LaunchFlags flags;
  flags.master_port = 31000;
  const LaunchFlags f = with_slurm_launch(flags, slurm);
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.master_addr, "10.0.0.9");
  EXPECT_EQ(f.master_port, 31000);
  // Outside a step the flags stay as given.
  EXPECT_FALSE(with_slurm_launch(LaunchFlags{}, {{"SLURM_JOB_ID", "5"}}).nnodes.has_value());
}

TEST(SlurmEnv, TheJobsIdAndRequeuesComeFromItsVariables) {
  EXPECT_FALSE(slurm_job({}).has_value());
  const auto first = slurm_job({{"SLURM_JOB_ID", "41"}});
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->job_id, "41");
  EXPECT_EQ(first->restart_count, 0);
  EXPECT_EQ(slurm_job({{"SLURM_JOB_ID", "41"}, {"SLURM_RESTART_COUNT", "3"}})->restart_count, 3);
  EXPECT_THROW(slurm_job({{"SLURM_JOB_ID", "41"}, {"SLURM_RESTART_COUNT", "x"}}), ConfigError);
}

TEST(SlurmEnv, SignalSpecificationsParseAsSbatchReadsThem) {
  SlurmSignal s = parse_slurm_signal("B:USR1@120");
  EXPECT_EQ(s.number, SIGUSR1);
  EXPECT_EQ(s.lead_seconds, 120);
  EXPECT_TRUE(s.batch_shell);
  s = parse_slurm_signal("SIGHUP");
  EXPECT_EQ(s.number, SIGHUP);
  EXPECT_EQ(s.lead_seconds, 60);  // Slurm's default lead
  EXPECT_FALSE(s.batch_shell);
  EXPECT_EQ(parse_slurm_signal("RB:urg@0").number, SIGURG);
  EXPECT_EQ(parse_slurm_signal("10@30").number, 10);
  for (const char* bad :
       {"", "B:", "X:USR1", "USR1@", "USR1@-3", "USR1@70000", "NOPE", "65", "0", "USR1@1.5"})
    EXPECT_THROW(parse_slurm_signal(bad), ConfigError) << bad;
}

TEST(SlurmEnv, TheBatchScriptsSignalIsTheLastSbatchLineBeforeTheFirstCommand) {
  EXPECT_EQ(sbatch_signal_line("#!/bin/bash\n#SBATCH --time=5\n#SBATCH --signal=B:USR1@120\n"
                               "srun x\n"),
            "B:USR1@120");
  EXPECT_EQ(sbatch_signal_line("#!/bin/sh\n# a comment\n\n#SBATCH --signal HUP@90 --requeue\n"
                               "#SBATCH --signal=USR2@30\n"),
            "USR2@30");
  // sbatch stops reading options at the first command, and a commented-out line is no option.
  EXPECT_FALSE(sbatch_signal_line("#!/bin/sh\necho hi\n#SBATCH --signal=USR1@60\n").has_value());
  EXPECT_FALSE(sbatch_signal_line("#!/bin/sh\n##SBATCH --signal=USR1@60\n").has_value());
  EXPECT_FALSE(sbatch_signal_line("").has_value());
}

TEST(SlurmEnv, TheStartWarnsWhenTheTimeLimitLeavesNoTimeToSave) {
  SchedulerJob job;
  job.scheduler = "slurm";
  job.job_id = "7";
  job.restart_count = 2;
  job.time_limit_unix = 1000;
  job.signal = "SIGUSR1";
  job.signal_lead_seconds = 60;
  StopCost cost{10, 20, true};
  JobLines lines = describe_job(job, cost, 900);
  EXPECT_EQ(lines.info,
            "slurm job 7 (requeued 2 times): 100 s to its time limit; SIGUSR1 60 s "
            "before it");
  EXPECT_TRUE(lines.warnings.empty());
  cost.save_seconds = 55;  // 65 s to stop: more than the signal's 60
  lines = describe_job(job, cost, 900);
  ASSERT_EQ(lines.warnings.size(), 1u);
  EXPECT_NE(lines.warnings[0].find("comes 60 s before its time limit"), std::string::npos);
  EXPECT_NE(lines.warnings[0].find("--signal=B:USR1@130"), std::string::npos);
  lines = describe_job(job, cost, 990);  // 10 s left
  ASSERT_EQ(lines.warnings.size(), 2u);
  EXPECT_NE(lines.warnings[1].find("10 s left"), std::string::npos);
  job.signal.clear();
  cost.save_seconds = 1;
  lines = describe_job(job, cost, 900);
  ASSERT_EQ(lines.warnings.size(), 1u);
  EXPECT_NE(lines.warnings[0].find("no warning signal"), std::string::npos);
  EXPECT_TRUE(describe_job(SchedulerJob{}, cost, 900).info.empty());
  // No time limit known (no scontrol): the signal's lead still reads as a sentence.
  SchedulerJob unlimited = job;
  unlimited.time_limit_unix = 0;
  unlimited.signal = "SIGUSR1";
  EXPECT_EQ(describe_job(unlimited, cost, 900).info,
            "slurm job 7 (requeued 2 times); SIGUSR1 60 s before its time limit");
  // A signal without a name is suggested by its number, as sbatch takes it.
  job.signal = "signal 40";
  cost.save_seconds = 100;
  lines = describe_job(job, cost, 900);
  ASSERT_FALSE(lines.warnings.empty());
  EXPECT_NE(lines.warnings[0].find("--signal=B:40@"), std::string::npos) << lines.warnings[0];
}

TEST(SlurmEnv, CommandOutputIsStdoutOfASuccessWithinItsTime) {
  EXPECT_EQ(command_output({"echo", "hello"}, 10), "hello\n");
  EXPECT_FALSE(command_output({"false"}, 10).has_value());
  EXPECT_FALSE(command_output({"gpurun-no-such-command"}, 10).has_value());
  EXPECT_FALSE(command_output({"sleep", "30"}, 0.2).has_value());
  EXPECT_FALSE(command_output({}, 1).has_value());
}

}  // namespace
}  // namespace gpurun

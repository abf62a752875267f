// gpurun under a real Slurm (issue 43): Debian's slurmctld and two slurmd nodes, each in a network
// and UTS namespace of its own, started once for these tests by ctest (scripts/slurm-cluster.sh,
// the fixture in tests/CMakeLists.txt). The jobs run examples/slurm/train.sbatch itself, or a
// batch script of the same shape for srun's several tasks, and every one ends at the digest of
// the same run trained without Slurm. Each test waits for Slurm's states and gpurun's events,
// never for a fixed time: the cluster's requeue delay (cred_expire=10) and its 30 s checks of
// time limits are Slurm's own.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;

const std::string kClusterScript = std::string(GPURUN_SOURCE_DIR) + "/scripts/slurm-cluster.sh";
const std::string kExample = std::string(GPURUN_SOURCE_DIR) + "/examples/slurm/train.sbatch";

/// The cluster's folder (GPURUN_SLURM_CLUSTER_DIR, else the fixture's), or "" when none runs.
std::string cluster_dir() {
  if (const char* dir = std::getenv("GPURUN_SLURM_CLUSTER_DIR")) return dir;
  if (fs::exists(std::string(GPURUN_SLURM_CLUSTER_DIR) + "/env")) return GPURUN_SLURM_CLUSTER_DIR;
  return "";
}

/// 1600 samples, batch 40: 40 steps an epoch, 2 epochs, a checkpoint every 8 steps.
std::string config(const TempDir& dir, const std::string& extra = "") {
  return write_config(dir,
                      "model: {name: mlp, hidden: [64]}\n"
                      "data: {name: idx, train_samples: 1600, eval_samples: 200}\n"
                      "optim: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                      "train: {epochs: 2, batch_size: 40, eval_batch_size: 200, seed: 7, "
                      "threads: 1}\n"
                      "checkpoint: {every_steps: 8, keep_last: 2}\n"
                      "memory: {probe_steps: 1}\n"
                      "log: {every_steps: 1}\n" +
                          extra);
}

class Slurm : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = cluster_dir();
    if (cluster_.empty())
      GTEST_SKIP() << "no Slurm cluster: " GPURUN_SLURM_CLUSTER_DIR
                      "/env is missing (ctest's fixture SlurmCluster.Start starts "
                      "scripts/slurm-cluster.sh there)";
  }

  void TearDown() override {
    // A job a failed test left behind would hold the nodes for the next test.
    for (const std::string& id : jobs_) ctl({"scancel", "--full", "--signal=KILL", id});
    for (const std::string& id : jobs_) wait_state(id, {"COMPLETED", "CANCELLED", "FAILED"}, 60);
  }

  /// Runs `cmd` on node 0 of the cluster (its network, SLURM_CONF set) with `env` added.
  Result ctl(const std::vector<std::string>& cmd, const Env& env = {}) const {
    std::vector<std::string> argv{kClusterScript, "exec", cluster_, "--", "/usr/bin/env"};
    for (const auto& [k, v] : env) argv.push_back(k + "=" + v);
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    return run_program(argv, 60);
  }

  /// sbatch `args` (the script last); the job's id. The job's environment is the test's, plus
  /// `env` (sbatch --export=ALL, Slurm's default).
  std::string submit(const std::vector<std::string>& args, const Env& env) {
    // By its path: `env` may hold a PATH of the job's own.
    std::vector<std::string> cmd{"/usr/bin/sbatch", "--parsable", "--chdir=" GPURUN_SOURCE_DIR};
    cmd.insert(cmd.end(), args.begin(), args.end());
    const Result r = ctl(cmd, env);
    if (r.exit_code != 0) throw std::runtime_error("sbatch failed: " + r.out + r.err);
    std::string id = trimmed(r.out);
    id = id.substr(0, id.find(';'));
    jobs_.push_back(id);
    return id;
  }

  /// `scontrol show job ID`'s fields (JobState, Restarts, ExitCode, NodeList, ...).
  std::map<std::string, std::string> job(const std::string& id) const {
    const Result r = ctl({"scontrol", "show", "job", id});
    std::map<std::string, std::string> fields;
    std::istringstream words(r.out);
    for (std::string w; words >> w;)
      if (const size_t eq = w.find('='); eq != std::string::npos)
        fields.emplace(w.substr(0, eq), w.substr(eq + 1));
    return fields;
  }

  /// Waits until the job's state is one of `states`; the state then, "" on time out.
  std::string wait_state(const std::string& id, const std::set<std::string>& states,
                         double seconds) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string state = job(id)["JobState"];
      if (states.count(state)) return state;
      sleep_for(0.5);
    }
    return "";
  }

  /// sbatch options common to the tests: one CPU, a log of the job's own in `dir`, appended to
  /// across requeues as the example's --open-mode asks.
  std::vector<std::string> sbatch_options(const TempDir& dir) const {
    return {"--cpus-per-task=1", "--output=" + (dir / "job.log"), "--open-mode=append"};
  }

  /// The environment of the example's job: gpurun, the config, the checkpoint folder, and steps
  /// slowed to `sleep_ms` (GPURUN_FAULT; in every start, GPURUN_FAULT_RESTART), so that a job
  /// runs long enough for Slurm to stop it whatever the machine's speed.
  static Env job_env(const std::string& cfg, const std::string& ckpt, int sleep_ms,
                     const std::string& args = "") {
    return {{"GPURUN", GPURUN_BINARY},
            {"CONFIG", cfg},
            {"CKPT", ckpt},
            {"GPURUN_ARGS", args},
            {"GPURUN_FAULT", "sleep" + std::to_string(sleep_ms) + ":after_step:*"},
            {"GPURUN_FAULT_RESTART", "0,1,2,3"}};
  }

  /// The final checkpoint's digest, and the run's expected one (trained without Slurm).
  static std::string digest(const std::string& ckpt) {
    return inspect(ckpt).value("model_digest", "");
  }
  static std::string reference(const TempDir& dir, const std::string& cfg,
                               const std::vector<std::string>& more = {}) {
    std::vector<std::string> args{"--ckpt", dir / "reference", cfg};
    args.insert(args.end(), more.begin(), more.end());
    const Result r = run_gpurun(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return digest(dir / "reference");
  }

  /// Every resume event of the run, and a check that each names the job and its requeue.
  std::vector<nlohmann::json> resumes(const std::string& run_dir, const std::string& id) const {
    std::vector<nlohmann::json> out = events(run_dir, "resume");
    for (const nlohmann::json& e : out) {
      EXPECT_TRUE(e.contains("job")) << e.dump();
      if (!e.contains("job")) continue;
      EXPECT_EQ(e["job"].value("scheduler", ""), "slurm");
      EXPECT_EQ(e["job"].value("job_id", ""), id);
    }
    return out;
  }

  /// The test's run: its config (`extra` YAML appended), the digest it ends at trained without
  /// Slurm (gpurun `reference_args`), and the checkpoint folder of the jobs.
  void prepare(const std::string& extra = "", const std::vector<std::string>& reference_args = {}) {
    cfg_ = config(dir_, extra);
    want_ = reference(dir_, cfg_, reference_args);
    ckpt_ = dir_ / "ckpt";
  }

  /// Waits for job `id` to complete, and checks it ended at the reference's digest.
  void expect_completed_at_the_reference(const std::string& id, double seconds) {
    ASSERT_EQ(wait_state(id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, seconds), "COMPLETED")
        << slurp(dir_ / "job.log");
    EXPECT_EQ(digest(ckpt_), want_) << slurp(dir_ / "job.log");
  }

  std::string cluster_;
  std::vector<std::string> jobs_;
  TempDir dir_;
  std::string cfg_, want_, ckpt_;
};

// The time limit, as examples/slurm/train.sbatch meets it: a 1-minute limit with the signal 40 s
// before it, for a run of 80 steps of at least 0.8 s each (64 s or more: never done in one
// start). The job saves at each signal, requeues itself, and its starts add up to the run.
TEST_F(Slurm, TheTimeLimitsSignalRequeuesTheJobUntilTheRunIsDone) {
  prepare();
  std::vector<std::string> args = sbatch_options(dir_);
  args.insert(args.end(), {"--time=1", "--signal=B:USR1@40", kExample});
  // The command line's --signal overrides the script's #SBATCH line, which is all gpurun can
  // read: --slurm-signal tells it.
  const std::string id = submit(args, job_env(cfg_, ckpt_, 800, "--slurm-signal B:USR1@40"));
  expect_completed_at_the_reference(id, 540);
  const auto fields = job(id);
  EXPECT_GE(std::stoi(fields.at("Restarts")), 1);
  // One log across the starts (--open-mode=append), each start saying which it is.
  const std::string log = slurp(dir_ / "job.log");
  EXPECT_TRUE(contains(log, "gpurun job " + id + ": start 1 ")) << log;
  EXPECT_TRUE(contains(log, "gpurun job " + id + ": start 2 ")) << log;
  EXPECT_TRUE(contains(log, "; requeued")) << log;
  EXPECT_TRUE(contains(log, "SIGUSR1 40 s before it")) << log;
  // Each stop was SIGUSR1's.
  const auto signals = events(ckpt_, "signal");
  ASSERT_FALSE(signals.empty());
  for (const auto& s : signals) EXPECT_EQ(s.value("signal", 0), SIGUSR1) << s.dump();
  const auto resumed = resumes(ckpt_, id);
  ASSERT_FALSE(resumed.empty());
  EXPECT_GE(resumed.back()["job"].value("restart_count", 0), 1);
  expect_exact_resume_checks(ckpt_);
}

// Preemption by a job of a higher-priority partition (PreemptMode=REQUEUE, GraceTime=5): Slurm
// sends SIGTERM at the grace time's end, gpurun saves and exits 75, and Slurm requeues the job
// itself. Here the job cannot see scontrol (a container without Slurm's commands): the example
// says so in its log and leaves the requeue to Slurm, which is all a preemption needs.
TEST_F(Slurm, APreemptedJobSavesAndSlurmRequeuesItEvenWithoutScontrol) {
  prepare();
  // PATH with `hostname` alone: the job's shell finds no scontrol, and neither does gpurun.
  fs::create_directories(dir_ / "bin");
  fs::create_symlink("/usr/bin/hostname", dir_ / "bin/hostname");
  // 80 steps of 0.8 s or more: Slurm's scheduler takes up to half a minute to preempt.
  Env env = job_env(cfg_, ckpt_, 800);
  env["PATH"] = dir_ / "bin";
  std::vector<std::string> args = sbatch_options(dir_);
  args.insert(args.end(),
              {"--partition=low", "--nodelist=gpurun-n0", "--cpus-per-task=2", kExample});
  const std::string id = submit(args, env);
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt_, 0, "", 120)) << slurp(dir_ / "job.log");
  const std::string high = submit({"--partition=high", "--nodelist=gpurun-n0", "--cpus-per-task=2",
                                   "--output=/dev/null", "--wrap=sleep 2"},
                                  {});
  ASSERT_EQ(wait_state(high, {"COMPLETED"}, 180), "COMPLETED") << slurp(dir_ / "job.log");
  expect_completed_at_the_reference(id, 300);
  const std::string log = slurp(dir_ / "job.log");
  EXPECT_TRUE(contains(log, "scontrol is not available here")) << log;
  EXPECT_TRUE(contains(log, ": start 2 ")) << log;
  const auto signals = events(ckpt_, "signal");
  ASSERT_FALSE(signals.empty());
  EXPECT_EQ(signals.front().value("signal", 0), SIGTERM);
  EXPECT_GE(resumes(ckpt_, id).size(), 1u);
}

// scancel --signal=TERM --full (every process of the job, the batch shell included), then
// `scontrol requeue` by hand: each time gpurun saves, exits 75 and the job starts again.
TEST_F(Slurm, ScancelSignalTermAndARequeueByHandBothResume) {
  prepare();
  std::vector<std::string> args = sbatch_options(dir_);
  args.push_back(kExample);
  const std::string id = submit(args, job_env(cfg_, ckpt_, 300));
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt_, 0, "", 120)) << slurp(dir_ / "job.log");
  ASSERT_EQ(ctl({"scancel", "--signal=TERM", "--full", id}).exit_code, 0);
  ASSERT_TRUE(wait_for_event(ckpt_, "resume", {}, 0, 120)) << slurp(dir_ / "job.log");
  const std::string before = slurp(ckpt_ + "/LATEST");
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt_, 0, before, 120)) << slurp(dir_ / "job.log");
  ASSERT_EQ(ctl({"scontrol", "requeue", id}).exit_code, 0);
  expect_completed_at_the_reference(id, 300);
  EXPECT_GE(std::stoi(job(id).at("Restarts")), 2);
  const auto resumed = resumes(ckpt_, id);
  ASSERT_GE(resumed.size(), 2u);
  EXPECT_EQ(resumed.back()["job"].value("restart_count", 0), 2);
  expect_exact_resume_checks(ckpt_);
}

// A node failure: everything on the job's node is killed at once (slurmd, gpurun: no save) and
// the node set DOWN; Slurm requeues the --requeue job, which starts again once the node is back
// and resumes from the newest checkpoint, not from scratch.
TEST_F(Slurm, ANodeFailureRequeuesTheJobWhichResumesFromItsNewestCheckpoint) {
  prepare();
  std::vector<std::string> args = sbatch_options(dir_);
  args.insert(args.end(), {"--nodelist=gpurun-n1", kExample});
  const std::string id = submit(args, job_env(cfg_, ckpt_, 300));
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt_, 0, "", 120)) << slurp(dir_ / "job.log");
  const std::string before = slurp(ckpt_ + "/LATEST");
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt_, 0, before, 120)) << slurp(dir_ / "job.log");
  const int64_t saved = events(ckpt_, "checkpoint").back().value("global_step", int64_t{0});
  const Result crash = run_program({kClusterScript, "node-crash", cluster_, "1"}, 60);
  ASSERT_EQ(crash.exit_code, 0) << crash.err;
  EXPECT_EQ(wait_state(id, {"PENDING", "REQUEUED"}, 60).empty(), false);
  const Result back = run_program({kClusterScript, "node-restart", cluster_, "1"}, 60);
  ASSERT_EQ(back.exit_code, 0) << back.err;
  expect_completed_at_the_reference(id, 300);
  const auto resumed = resumes(ckpt_, id);
  ASSERT_EQ(resumed.size(), 1u);
  // From a checkpoint at least as new as the newest seen before the crash, not from scratch.
  EXPECT_GE(resumed[0].value("global_step", int64_t{0}), saved) << resumed[0].dump();
  EXPECT_GT(saved, 0);
}

// A batch script that runs one gpurun worker per Slurm task (srun, Gloo): RANK from
// SLURM_PROCID, the rendezvous at the first node of the step. Requeued by hand in the middle.
class SlurmTasks : public Slurm, public ::testing::WithParamInterface<bool> {};

TEST_P(SlurmTasks, TwoTasksTrainAsTwoRanksAndResumeAfterARequeue) {
  const bool two_nodes = GetParam();
  // Two nodes: the optimizer state sharded across them; one node: replicated.
  prepare(two_nodes ? "distributed: {shard: optimizer}\n" : "", {"--nproc-per-node", "2"});
  const std::string script = dir_ / "tasks.sbatch";
  std::ofstream(script) << "#!/bin/bash\n"
                           "#SBATCH --requeue\n"
                           "echo \"tasks job $SLURM_JOB_ID: start $((${SLURM_RESTART_COUNT:-0} + "
                           "1))\"\n"
                           "srun --kill-on-bad-exit=1 \"$GPURUN\" --resume --ckpt \"$CKPT\" "
                           "\"$CONFIG\"\n";
  std::vector<std::string> args = sbatch_options(dir_);
  if (two_nodes)
    args.insert(args.end(), {"--nodes=2", "--ntasks-per-node=1"});
  else
    args.insert(args.end(), {"--nodes=1", "--ntasks=2", "--nodelist=gpurun-n0"});
  args.push_back(script);
  const std::string id = submit(args, job_env(cfg_, ckpt_, 200));
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt_, 0, "", 180)) << slurp(dir_ / "job.log");
  ASSERT_EQ(ctl({"scontrol", "requeue", id}).exit_code, 0);
  expect_completed_at_the_reference(id, 300);
  const auto plans = events(ckpt_, "plan");
  ASSERT_FALSE(plans.empty());
  EXPECT_EQ(plans.back().value("world_size", 0), 2) << plans.back().dump();
  EXPECT_GE(resumes(ckpt_, id).size(), 1u);
  expect_exact_resume_checks(ckpt_);
}

INSTANTIATE_TEST_SUITE_P(OneNodeAndTwoNodes, SlurmTasks, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "TwoNodes" : "OneNode"; });

// Stopped before anything was saved (right as the job starts, gpurun perhaps still loading):
// the requeued job starts cleanly with --resume on an empty folder.
TEST_F(Slurm, AJobStoppedBeforeItsFirstCheckpointStartsCleanly) {
  prepare();
  std::vector<std::string> args = sbatch_options(dir_);
  args.push_back(kExample);
  // 200 ms a step: the run is still going when wait_state, polling through the cluster, sees it.
  const std::string id = submit(args, job_env(cfg_, ckpt_, 200));
  ASSERT_EQ(wait_state(id, {"RUNNING", "COMPLETED"}, 60), "RUNNING");
  ASSERT_EQ(ctl({"scancel", "--signal=TERM", "--full", id}).exit_code, 0);
  expect_completed_at_the_reference(id, 300);
  EXPECT_GE(std::stoi(job(id).at("Restarts")), 1) << slurp(dir_ / "job.log");
}

// A time limit too short to save in is said at the start: here the job's own #SBATCH line asks
// for the signal 1 s before the limit, less than one step of this run takes.
TEST_F(Slurm, ASignalTooLateToSaveInIsWarnedAboutAtTheStart) {
  cfg_ = config(dir_);  // no reference: the run is cancelled once its start is logged
  ckpt_ = dir_ / "ckpt";
  const std::string script = dir_ / "late.sbatch";
  std::ofstream(script) << "#!/bin/bash\n"
                           "#SBATCH --time=10\n"
                           "#SBATCH --signal=B:USR2@1\n"
                           "exec \"$GPURUN\" --ckpt \"$CKPT\" --set train.epochs=1 \"$CONFIG\"\n";
  std::vector<std::string> args = sbatch_options(dir_);
  args.push_back(script);
  const std::string id = submit(args, job_env(cfg_, ckpt_, 2000));
  ASSERT_TRUE(wait_for_event(ckpt_, "plan", {}, 0, 120)) << slurp(dir_ / "job.log");
  ASSERT_EQ(ctl({"scancel", "--full", id}).exit_code, 0);
  wait_state(id, {"COMPLETED", "FAILED", "CANCELLED"}, 120);
  const std::string log = slurp(dir_ / "job.log");
  EXPECT_TRUE(contains(log, "slurm job " + id + ": ")) << log;
  EXPECT_TRUE(contains(log, "SIGUSR2 1 s before it")) << log;
  EXPECT_TRUE(contains(log, "the job's SIGUSR2 comes 1 s before its time limit")) << log;
  const auto plans = events(ckpt_, "plan");
  ASSERT_FALSE(plans.empty());
  EXPECT_EQ(plans[0]["job"].value("job_id", ""), id);
}

}  // namespace
}  // namespace gpurun::test

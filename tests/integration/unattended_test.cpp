// Surviving reclaim unattended (issue 4): signals, slow storage (case 14), storage faults on
// real tmpfs mounts, the supervisor's restarts, and the directory lease.
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;

bool has_temporaries(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) return true;
  return false;
}

TEST(Signals, SigtermAtRandomMomentsExits75InTimeAndResumesToTheSameDigest) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(2400, 40, 2));
  const std::vector<std::string> sets{"model.hidden=[256,256]", "checkpoint.every_steps=25"};
  // 20 ms after every step: a run long enough (>= 2.4 s) for three signals on any machine.
  const Env slow{{"GPURUN_FAULT", "sleep20:after_step:*"}};
  Result reference = run_gpurun(with_sets({config, "--ckpt", dir / "reference"}, sets), slow);
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const std::string expected = inspect(dir / "reference").value("model_digest", "");

  const std::string ckpt = dir / "ckpt";
  std::mt19937 rng(75);
  std::uniform_real_distribution<double> delay(0.0, 0.4);
  int stopped = 0;
  for (int attempt = 0; attempt < 10; ++attempt) {
    const std::string before = slurp(ckpt + "/LATEST");
    pid_t pid =
        start_gpurun(with_sets({config, "--ckpt", ckpt, "--resume"}, sets), dir / "run", slow);
    if (stopped < 3 && wait_for_new_checkpoint(ckpt, pid, before)) {
      sleep_for(delay(rng));
      kill(pid, SIGTERM);
    }
    const auto t0 = std::chrono::steady_clock::now();
    Result r = wait_gpurun(pid, dir / "run");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.exit_code == 0) break;
    ASSERT_EQ(r.exit_code, 75) << r.err;
    EXPECT_LT(seconds, 25.0) << "must fit checkpoint.grace_seconds";
    EXPECT_TRUE(contains(r.err, "--resume")) << r.err;
    ++stopped;
    // What a stop saved is the newest complete checkpoint: the signal's own step.
    auto signal_events = events(ckpt, "signal");
    ASSERT_FALSE(signal_events.empty());
    EXPECT_EQ(inspect(ckpt)["global_step"], signal_events.back()["global_step"]);
  }
  EXPECT_GE(stopped, 2);
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""), expected);
}

// Case 14: a save that takes longer than a step (slow network storage).
TEST(Cases, SlowStorageDoesNotBlockTrainingAndASignalStillEndsComplete) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(2400, 40, 1));
  const std::vector<std::string> sets{"checkpoint.every_steps=10", "model.hidden=[256]"};
  const Env slow{{"GPURUN_FAULT", "sleep700:before_rename:*"}};
  Result full = run_gpurun(with_sets({config, "--ckpt", dir / "full"}, sets), slow);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  auto saves = events(dir / "full", "checkpoint");
  ASSERT_GE(saves.size(), 3u);
  for (const auto& e : saves) {
    EXPECT_GE(e["write_seconds"].get<double>(), 0.7);
    EXPECT_TRUE(e.contains("stall_seconds"));
  }
  // The first save's stall is the host copy only, far below its write time.
  EXPECT_LT(saves[0]["stall_seconds"].get<double>(), 0.5 * saves[0]["write_seconds"].get<double>());

  const std::string ckpt = dir / "ckpt";
  pid_t pid = start_gpurun(with_sets({config, "--ckpt", ckpt}, sets), dir / "run", slow);
  ASSERT_TRUE(wait_for_write_in_flight(ckpt, pid, 60)) << slurp(dir / "run.err");
  kill(pid, SIGTERM);
  Result r = wait_gpurun(pid, dir / "run");
  ASSERT_EQ(r.exit_code, 75) << r.err;
  const auto signal_events = events(ckpt, "signal");
  ASSERT_EQ(signal_events.size(), 1u);
  nlohmann::json newest = inspect(ckpt);
  EXPECT_EQ(newest["global_step"], signal_events[0]["global_step"]);
  EXPECT_EQ(run_gpurun({"ckpt", "verify", ckpt}).exit_code, 0);
  EXPECT_FALSE(has_temporaries(ckpt));
}

TEST(Storage, FullDiskKeepsTheLastCheckpointAndStopsAfterMaxFailures) {
  Tmpfs disk("6m", false);
  if (!disk.ok()) GTEST_SKIP() << "mount(tmpfs) is not permitted here";
  TempDir dir;
  const std::string config = write_config(dir, small_config(2400, 40, 3));
  // Each checkpoint is ~3.5 MB: the first fits, a second one beside it does not.
  Result r = run_gpurun(with_sets({config, "--ckpt", disk.path(), "--run-dir", dir / "run"},
                                  {"model.hidden=[512,256]", "checkpoint.every_steps=10",
                                   "checkpoint.keep_last=1", "checkpoint.max_failures=3"}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "No space left on device")) << r.err;
  EXPECT_TRUE(contains(r.err, "training goes on")) << r.err;
  // The third failure stops the run, and says so rather than that training goes on.
  EXPECT_TRUE(contains(r.err, "that is checkpoint.max_failures (3 of 3")) << r.err;
  EXPECT_FALSE(contains(r.err, "saves again at the next checkpoint (3 of 3")) << r.err;
  EXPECT_EQ(events(dir / "run", "checkpoint_failed").size(), 3u);
  EXPECT_EQ(run_gpurun({"ckpt", "verify", disk.path()}).exit_code, 0);
  EXPECT_EQ(inspect(disk.path())["global_step"], 10);
  EXPECT_FALSE(has_temporaries(disk.path()));
}

// Issue 16: a read-only --ckpt trained to the end, saved nothing, and exited 0.
TEST(Storage, ReadOnlyTargetIsRefusedAtStartWithExit2NamingTheCause) {
  Tmpfs disk("1m", true);
  if (!disk.ok()) GTEST_SKIP() << "mount(tmpfs) is not permitted here";
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 1));
  // As the user ran it: the run's files go to the checkpoint directory too.
  Result r = run_gpurun({config, "--ckpt", disk.path()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "Read-only file system")) << r.err;
  EXPECT_TRUE(contains(r.err, disk.path())) << r.err;
  EXPECT_FALSE(contains(r.err, "training goes on")) << r.err;
  EXPECT_FALSE(contains(r.err, "finished:")) << r.err;  // the end's line

  // A directory still to be made on it, the run's files elsewhere: refused before training.
  const std::string sub = disk.path() + "/runs/a";
  r = run_gpurun({config, "--ckpt", sub, "--run-dir", dir / "run"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "Read-only file system")) << r.err;
  EXPECT_TRUE(events(dir / "run", "step").empty()) << r.err;
  EXPECT_TRUE(events(dir / "run", "done").empty()) << "a refused run is no run";
  // The same without --run-dir: the run's files would go there too.
  r = run_gpurun({config, "--ckpt", sub});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "checkpoint directory " + sub + " cannot be written")) << r.err;
}

// A full disk refuses the start as well, and the write probe that found it leaves nothing
// behind (the file can be created, empty, where its bytes do not fit).
TEST(Storage, AFullTargetIsRefusedAtStartAndTheWriteProbeLeavesNothing) {
  Tmpfs disk("1m", false);
  if (!disk.ok()) GTEST_SKIP() << "mount(tmpfs) is not permitted here";
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 1));
  // A 1 MiB tmpfs, filled to the last byte.
  std::string fill(1 << 20, 'x');
  if (FILE* f = std::fopen((disk.path() + "/fill").c_str(), "wb")) {
    std::fwrite(fill.data(), 1, fill.size(), f);
    std::fclose(f);
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    Result r = run_gpurun({config, "--ckpt", disk.path(), "--run-dir", dir / "run"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "No space left on device")) << r.err;
  }
  for (const auto& e : std::filesystem::directory_iterator(disk.path()))
    EXPECT_EQ(e.path().filename().string(), "fill") << "left behind: " << e.path();
}

// Issue 16: a run whose final checkpoint failed (fewer than max_failures in a row) said
// "finished" and exited 0; the trained model was lost.
TEST(Storage, AFinalCheckpointThatIsNotWrittenExits1SayingWhatIsLost) {
  Tmpfs disk("6m", false);
  if (!disk.ok()) GTEST_SKIP() << "mount(tmpfs) is not permitted here";
  TempDir dir;
  const std::string config = write_config(dir, small_config(2400, 40, 1));  // 60 steps
  // Each checkpoint is ~3.5 MB: the step-10 one fits, none beside it does.
  Result r = run_gpurun(with_sets({config, "--ckpt", disk.path(), "--run-dir", dir / "run"},
                                  {"model.hidden=[512,256]", "checkpoint.every_steps=10",
                                   "checkpoint.keep_last=1", "checkpoint.max_failures=100"}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_FALSE(contains(r.err, "finished:")) << r.err;  // the end's line
  EXPECT_TRUE(contains(r.err, "final checkpoint (global step 60) was not written")) << r.err;
  EXPECT_TRUE(contains(r.err, "No space left on device")) << r.err;
  EXPECT_TRUE(contains(r.err, "50 optimizer steps after global step 10 are not saved")) << r.err;
  EXPECT_TRUE(contains(r.err, disk.path() + "/ckpt-e0000-s0000010")) << r.err;
  const auto done = events(dir / "run", "done");
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]["exit_code"], 1);
  EXPECT_EQ(nlohmann::json::parse(slurp(dir / "run/status.json"))["state"], "failed");
  EXPECT_EQ(inspect(disk.path())["global_step"], 10);
}

// Issue 16: the lease failing to be written mid-run must not be "training goes on": without
// a heartbeat another machine may take the directory over, so the run stops.
TEST(Storage, StorageTurningReadOnlyMidRunExpiresTheLeaseAndStopsWithExit1) {
  Tmpfs disk("64m", false);
  if (!disk.ok()) GTEST_SKIP() << "mount(tmpfs) is not permitted here";
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 50));  // 1000 steps
  pid_t pid = start_gpurun(with_sets({config, "--ckpt", disk.path(), "--run-dir", dir / "run"},
                                     {"checkpoint.lease_timeout=2", "checkpoint.every_steps=5",
                                      "checkpoint.max_failures=1000"}),
                           dir / "run", {{"GPURUN_FAULT", "sleep100:after_step:*"}});
  ASSERT_TRUE(wait_for_new_checkpoint(disk.path(), pid, "")) << slurp(dir / "run.err");
  ASSERT_TRUE(disk.remount_read_only()) << std::strerror(errno);
  Result r = wait_gpurun(pid, dir / "run");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "the lease of " + disk.path() + " expired")) << r.err;
  EXPECT_TRUE(contains(r.err, "Read-only file system")) << r.err;
  EXPECT_TRUE(contains(r.err, "Stopping without saving")) << r.err;
  EXPECT_TRUE(contains(r.err, "the newest complete checkpoint is " + disk.path() + "/ckpt-"))
      << r.err;
  EXPECT_FALSE(contains(r.err, "finished:")) << r.err;  // the end's line
}

TEST(Supervisor, TwoCrashesWithMaxRestarts3FinishWithTheRightDigest) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 2));
  // Synchronous saves, so that the step-4 checkpoint is complete when step 7 crashes and
  // each restart resumes from it (with background writes it may still be in flight).
  const std::vector<std::string> sets{"checkpoint.every_steps=4", "checkpoint.async=false"};
  Result reference = run_gpurun(with_sets({config, "--ckpt", dir / "reference"}, sets));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  // The fault fires in the first run and in the first restart; the second restart runs clean.
  Result r = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt", "--max-restarts", "3"}, sets),
                        {{"GPURUN_FAULT", "abort:after_step:7"}, {"GPURUN_FAULT_RESTART", "0,1"}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(inspect(dir / "ckpt")["model_digest"], inspect(dir / "reference")["model_digest"]);
  // Three runs of the worker, counted by the supervisor: the events of a run that aborts a
  // few milliseconds after its plan may not have reached metrics.jsonl (a background writer,
  // under load), as after any abort.
  EXPECT_EQ(count_of(r.err, "starting (restart"), 3u) << r.err;
  EXPECT_GE(events(dir / "ckpt", "resume").size(), 1u);  // the clean run's, at least
  EXPECT_TRUE(contains(r.err, "SIGABRT")) << r.err;
}

// Issue 16 defect 6: the launcher's report names the step the worker really reached, the one
// its stop saved, not that of an earlier heartbeat (rewritten at most once a second).
TEST(Supervisor, StoppedWorkerIsReportedAtTheStepItSaved) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 1));
  // No step events: the stop itself must bring the heartbeat up to date.
  Result r = run_gpurun(
      with_sets({config, "--ckpt", dir / "ckpt", "--max-restarts", "1"}, {"log.every_steps=100"}),
      {{"GPURUN_FAULT", "sigterm:after_step:3"}});
  ASSERT_EQ(r.exit_code, 75) << r.err;
  const auto signals = events(dir / "ckpt", "signal");
  ASSERT_EQ(signals.size(), 1u);
  EXPECT_EQ(signals[0]["global_step"], 3);
  EXPECT_EQ(inspect(dir / "ckpt")["global_step"], 3);
  EXPECT_TRUE(contains(r.err, "worker exited with code 75 at step 3 (stopped by a signal)"))
      << r.err;
}

// Issue 31, item 8: a TorchScript module that fails on the epoch's short last batch. The error
// names the optimizer step and the batch's shape, and a failure that repeats at the same step
// with the same message is not retried again: a restart resumes the same data and weights.
TEST(Supervisor, AFailureThatRepeatsAtTheSameStepIsNotRetriedAgainAndNamesTheBatch) {
  TempDir dir;
  const std::string script = dir / "net.py";
  std::ofstream(script) << "import sys, torch\n"
                           "class Net(torch.nn.Module):\n"
                           "    def __init__(self):\n"
                           "        super().__init__()\n"
                           "        self.body = torch.nn.Sequential(torch.nn.Flatten(),\n"
                           "                                        torch.nn.Linear(784, 10))\n"
                           "    def forward(self, x):\n"
                           "        if x.size(0) == 4:\n"
                           "            raise RuntimeError('no batch of 4 samples')\n"
                           "        return self.body(x)\n"
                           "torch.jit.script(Net()).save(sys.argv[1])\n";
  Result py = run_program({kPython, script, dir / "net.pt"});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  // 20 samples in batches of 8: the third step of the epoch is the short batch of 4.
  const std::string config = write_config(dir,
                                          "model: {torchscript: net.pt}\n"
                                          "data: {name: idx, train_samples: 20, eval_samples: 8}\n"
                                          "optim: {name: sgd, lr: 0.05}\n"
                                          "train: {epochs: 1, batch_size: 8, threads: 1}\n");
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt", "--max-restarts", "3"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "optimizer step 3 (epoch 1, micro-batches of 8): the forward pass "
                       "and loss of a batch of shape [4, 1, 28, 28] failed"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "no batch of 4 samples")) << r.err;
  EXPECT_TRUE(contains(r.err, "again, with the same error")) << r.err;
  EXPECT_TRUE(contains(r.err, "not restarting")) << r.err;
  EXPECT_FALSE(contains(r.err, "restart 2/3")) << r.err;  // the first run and one restart only
}

TEST(Supervisor, ConfigErrorIsNotRetried) {
  TempDir dir;
  const std::string config = write_config(dir, "train: {epocs: 2}\n");
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt", "--max-restarts", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_FALSE(contains(r.err, "restart")) << r.err;
}

}  // namespace
}  // namespace gpurun::test

namespace gpurun::test {
namespace {

TEST(Lease, LiveHolderMakesASecondRunWaitThenExit2NamingIt) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 1));
  // The holder is a real gpurun, slowed down so that it is alive for the whole test: 50 epochs
  // of 20 steps of 300 ms (train.epochs is not hashed: the third run resumes it with one).
  pid_t holder = start_gpurun({config, "--ckpt", dir / "ckpt", "--set",
                               "checkpoint.lease_timeout=2", "--set", "train.epochs=50"},
                              dir / "holder", {{"GPURUN_FAULT", "sleep300:after_step:*"}});
  // Training, so that its lease is held (the first step's event, not a fixed wait).
  ASSERT_TRUE(wait_for_step(dir / "ckpt", 1, holder)) << slurp(dir / "holder.err");
  const auto t0 = std::chrono::steady_clock::now();
  Result second = run_gpurun(
      {config, "--ckpt", dir / "ckpt", "--resume", "--set", "checkpoint.lease_timeout=2"});
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_GE(waited, 1.9);
  EXPECT_NE(second.err.find("pid " + std::to_string(holder)), std::string::npos) << second.err;
  kill(holder, SIGKILL);
  EXPECT_EQ(wait_gpurun(holder, dir / "holder").signal, SIGKILL);  // killed while it trained

  // The holder is dead now (same host): its lease is taken over at once.
  const auto t1 = std::chrono::steady_clock::now();
  Result third = run_gpurun(
      {config, "--ckpt", dir / "ckpt", "--resume", "--set", "checkpoint.lease_timeout=30"});
  EXPECT_EQ(third.exit_code, 0) << third.err;
  EXPECT_TRUE(contains(third.err, "its process (pid " + std::to_string(holder) + ") is gone"))
      << third.err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 20.0);
}

TEST(Lease, StaleHeartbeatIsTakenOverAndForceTakesALiveOne) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(60, 30, 1));
  std::filesystem::create_directories(dir / "ckpt");
  // A lease from another machine whose heartbeat stopped 1000 s ago.
  const double now = unix_now();
  std::ofstream(dir / "ckpt/lease.json") << nlohmann::json{
      {"host", "reclaimed-spot-vm"},
      {"pid", 4242},
      {"started", now - 5000},
      {"heartbeat", now - 1000},
      {"token", "old"}}.dump();
  Result taken = run_gpurun({config, "--ckpt", dir / "ckpt"});
  EXPECT_EQ(taken.exit_code, 0) << taken.err;

  // A live holder saving every step; a new run forcibly takes the directory over and resumes.
  const std::string longer = write_config(dir, small_config(600, 30, 1), "longer.yaml");
  const Env slow{{"GPURUN_FAULT", "sleep300:after_step:*"}};
  // 50 epochs for the holder (not hashed), so that it still trains when it is displaced.
  pid_t holder = start_gpurun({longer, "--ckpt", dir / "ckpt2", "--set", "checkpoint.every_steps=1",
                               "--set", "train.epochs=50"},
                              dir / "holder", slow);
  ASSERT_TRUE(wait_for_new_checkpoint(dir / "ckpt2", holder, "")) << slurp(dir / "holder.err");
  Result forced = run_gpurun(
      {longer, "--ckpt", dir / "ckpt2", "--resume", "--force", "--set", "checkpoint.every_steps=1"},
      slow);
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_NE(forced.err.find("resuming from"), std::string::npos) << forced.err;
  // The displaced holder notices at its next save and stops without writing (exit 2).
  Result old = wait_gpurun(holder, dir / "holder");
  EXPECT_EQ(old.exit_code, 2) << old.err;
  EXPECT_NE(old.err.find("took it with --force"), std::string::npos) << old.err;
}

// checkpoint.every_minutes: auto. A tiny MTBF makes the interval short enough to be seen: it
// starts from the assumed 1 s save cost, then follows the measured stalls.
TEST(CheckpointInterval, AutoSavesAtTheYoungDalyIntervalOfTheMeasuredStallAndTheMtbf) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(2400, 40, 1));
  const double mtbf_hours = 0.0001;  // 0.36 s
  const Env slow{{"GPURUN_FAULT", "sleep30:after_step:*"}};
  Result r = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt"},
                                  {"checkpoint.every_minutes=auto",
                                   "checkpoint.mtbf_hours=" + std::to_string(mtbf_hours)}),
                        slow);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "checkpoint.every_minutes auto: a save every")) << r.err;
  EXPECT_TRUE(contains(r.err, "assumed until a save is measured")) << r.err;

  const auto chosen = events(dir / "ckpt", "checkpoint_interval");
  ASSERT_GE(chosen.size(), 2u) << r.err;
  const double mtbf = mtbf_hours * 3600;
  EXPECT_EQ(chosen.front()["measured_saves"], 0);
  EXPECT_NEAR(chosen.front()["seconds"].get<double>(), std::sqrt(2 * 1.0 * mtbf), 1e-9);
  // Re-chosen from what the saves measured: the median stall so far (never below 1 ms), and
  // never under twice the background write.
  const auto saves = events(dir / "ckpt", "checkpoint");
  const auto& next = chosen[1];
  const int64_t measured = next["measured_saves"].get<int64_t>();
  ASSERT_GE(measured, 1);
  ASSERT_GE(saves.size(), static_cast<size_t>(measured));
  std::vector<double> stalls;
  for (int64_t i = 0; i < measured; ++i) stalls.push_back(saves[i]["stall_seconds"].get<double>());
  std::sort(stalls.begin(), stalls.end());
  const double cost = std::max(stalls[stalls.size() / 2], 1e-3);
  EXPECT_NEAR(next["save_cost_seconds"].get<double>(), cost, 1e-9);
  const double write = next["write_seconds"].get<double>();
  EXPECT_NEAR(next["seconds"].get<double>(), std::max(std::sqrt(2 * cost * mtbf), 2 * write), 1e-9);
  // Time-based saves happened: more than the one at the end of the epoch.
  EXPECT_GE(saves.size(), 3u) << r.err;
}

}  // namespace
}  // namespace gpurun::test

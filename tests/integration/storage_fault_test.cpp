// Storage that fails the way network storage does, through the kernel: --ckpt on faultfs
// (tests/tools/faultfs), a FUSE pass-through whose faults the test turns on while gpurun runs
// (issue 15). Label `faults`: `ctest -L faults`. Each test skips, saying why, where faultfs is
// not built or /dev/fuse is missing.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/faultfs.h"
#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;

bool any_set_aside(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".damaged") != std::string::npos) return true;
  return false;
}

/// The model_digest of an uninterrupted run of `config` with `sets` into DIR/reference.
std::string reference_digest(const TempDir& dir, const std::string& config,
                             const std::vector<std::string>& sets) {
  Result reference = run_gpurun(with_sets({config, "--ckpt", dir / "reference"}, sets));
  EXPECT_EQ(reference.exit_code, 0) << reference.err;
  return inspect(dir / "reference").value("model_digest", "");
}

#define REQUIRE_FAULTFS(fs_)                             \
  do {                                                   \
    if (!(fs_).available()) GTEST_SKIP() << (fs_).why(); \
    ASSERT_TRUE((fs_).ok()) << (fs_).why();              \
  } while (0)

// A read error (EIO from the storage, not a damaged file) while the resume reads the newest
// checkpoint: the run exits 1, which a supervisor retries, naming the file and the error, and
// sets nothing aside; once the storage answers again the same checkpoint is resumed, exactly.
TEST(StorageFaults, AnEioWhileTheResumeReadsTheNewestCheckpointExits1AndSetsNothingAside) {
  FaultFs storage;
  REQUIRE_FAULTFS(storage);
  TempDir dir;
  const std::string config = write_config(dir, small_config(1200, 40, 2));
  const std::vector<std::string> sets{"checkpoint.every_steps=10"};
  const std::string expected = reference_digest(dir, config, sets);

  const std::string ckpt = storage.path() + "/ckpt";
  Result first = run_gpurun(with_sets({config, "--ckpt", ckpt, "--set", "train.epochs=1"}, sets));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string newest = trimmed(slurp(ckpt + "/LATEST"));
  ASSERT_FALSE(newest.empty());

  storage.set("error read EIO path " + newest + "/optim.pt");
  Result failed =
      run_gpurun(with_sets({config, "--ckpt", ckpt, "--resume", "--set", "train.epochs=2"}, sets));
  EXPECT_EQ(failed.exit_code, 1) << failed.err;
  EXPECT_TRUE(contains(failed.err, newest + "/optim.pt")) << failed.err;
  EXPECT_TRUE(contains(failed.err, "Input/output error")) << failed.err;
  EXPECT_FALSE(any_set_aside(ckpt)) << "a read error set a checkpoint aside";
  EXPECT_GT(storage.injected()["EIO"], 0) << storage.log();

  storage.set("");
  Result resumed =
      run_gpurun(with_sets({config, "--ckpt", ckpt, "--resume", "--set", "train.epochs=2"}, sets));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto resumes = events(ckpt, "resume");
  ASSERT_FALSE(resumes.empty());
  EXPECT_EQ(resumes.back()["path"], ckpt + "/" + newest);
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""), expected);
}

// Every write of a save fails with ENOSPC, EDQUOT or EIO in turn, then with ESTALE on the
// rename that would complete it: each failed save is named in the log with its errno, leaves no
// half checkpoint under a final name, and the run, storage back, ends at the uninterrupted
// digest.
TEST(StorageFaults, FailingWritesAndRenamesLoseNothingCompleteAndAreEachNamed) {
  FaultFs storage;
  REQUIRE_FAULTFS(storage);
  TempDir dir;
  const std::string config = write_config(dir, small_config(1200, 40, 2));
  const std::vector<std::string> sets{"checkpoint.every_steps=5", "checkpoint.max_failures=20"};
  const std::string expected = reference_digest(dir, config, sets);
  const std::string ckpt = storage.path() + "/ckpt", run = dir / "run";

  // 100 ms a step (6 s in all): the four faults below, each seen by one failed save, are all
  // set and cleared before the final save, however slowly this thread runs.
  const pid_t pid = start_gpurun(with_sets({config, "--ckpt", ckpt, "--run-dir", run}, sets),
                                 dir / "gpurun", {{"GPURUN_FAULT", "sleep100:after_step:*"}});
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt, pid, "", 120)) << slurp(dir / "gpurun.err");
  for (const std::string fault : {"error write ENOSPC path .tmp-", "error write EDQUOT path .tmp-",
                                  "error write EIO path .tmp-", "error rename ESTALE path ckpt-"}) {
    const auto failures_before = events(run, "checkpoint_failed").size();
    storage.set(fault);
    for (int i = 0; i < 400 && events(run, "checkpoint_failed").size() == failures_before; ++i)
      sleep_for(0.05);
    EXPECT_GT(events(run, "checkpoint_failed").size(), failures_before) << fault;
  }
  storage.set("");
  Result done = wait_gpurun(pid, dir / "gpurun");
  ASSERT_EQ(done.exit_code, 0) << done.err;
  for (const std::string err : {"No space left on device", "Disk quota exceeded",
                                "Input/output error", "Stale file handle"})
    EXPECT_TRUE(contains(done.err, err)) << err << "\n" << done.err;
  const auto counts = storage.injected();
  for (const std::string kind : {"ENOSPC", "EDQUOT", "EIO", "ESTALE"})
    EXPECT_GT(counts.count(kind) ? counts.at(kind) : 0, 0) << kind << "\n" << storage.log();
  Result verify = run_gpurun({"ckpt", "verify", ckpt});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""), expected);
}

// The network tier hangs (every operation blocks) under a run with a local tier, and with it
// the run directory, which stays --ckpt by default: training goes on and keeps checkpointing
// locally, and a stop signal still ends the run within checkpoint.grace_seconds + 5 s, exit 75,
// with its newest checkpoint complete in the local tier.
TEST(StorageFaults, AHungNetworkTierNeverFreezesTrainingAndAStopSignalStillExitsInTime) {
  FaultFs storage;
  REQUIRE_FAULTFS(storage);
  TempDir dir;
  const std::string config = write_config(dir, small_config(1200, 40, 20));
  const std::string ckpt = storage.path() + "/ckpt", local = dir / "local";
  const double grace = 3;
  const std::vector<std::string> sets{"checkpoint.every_steps=5", "checkpoint.local_dir=" + local,
                                      "checkpoint.grace_seconds=3"};
  const pid_t pid = start_gpurun(with_sets({config, "--ckpt", ckpt}, sets), dir / "gpurun",
                                 {{"GPURUN_FAULT", "sleep30:after_step:*"}});
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt, pid, "", 120)) << slurp(dir / "gpurun.err");
  storage.set("hang *");

  // Saves go on in the local tier while every call into the network tier blocks.
  std::string tier;
  for (int i = 0; i < 100 && tier.empty(); ++i) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(local, ec)) tier = e.path().string();
    if (tier.empty()) sleep_for(0.05);
  }
  ASSERT_FALSE(tier.empty());
  const std::string hung_at = slurp(tier + "/LATEST");
  ASSERT_TRUE(wait_for_new_checkpoint(tier, pid, hung_at, 60)) << slurp(dir / "gpurun.err");
  const std::string later = slurp(tier + "/LATEST");
  ASSERT_TRUE(wait_for_new_checkpoint(tier, pid, later, 60)) << slurp(dir / "gpurun.err");

  const auto start = std::chrono::steady_clock::now();
  ::kill(pid, SIGTERM);
  Result stopped = wait_gpurun(pid, dir / "gpurun", 60);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RecordProperty("stop_seconds", std::to_string(seconds));
  EXPECT_EQ(stopped.exit_code, 75) << stopped.err;
  EXPECT_LE(seconds, grace + 5) << stopped.err;
  EXPECT_GT(storage.injected()["hang"], 0) << storage.log();
  Result verify = run_gpurun({"ckpt", "verify", tier});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  EXPECT_TRUE(contains(stopped.err, "stopped by SIGTERM")) << stopped.err;

  // The storage answers again: the run resumes from the local tier's newest checkpoint.
  storage.set("");
  Result resumed = run_gpurun(with_sets({config, "--ckpt", ckpt, "--resume"}, sets));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, "resuming from the local tier")) << resumed.err;
}

// Three SIGKILLs of a run whose storage is slow (every write, fsync and rename waits 10 ms, as
// on a loaded NFS server) and drops one checkpoint write in twenty with EIO: each resume starts
// from a checkpoint at least as new as the newest complete one before the kill (nothing
// complete is lost), and the run, finished with the storage still slow, ends at the
// uninterrupted digest.
TEST(StorageFaults, KilledThreeTimesOnASlowFlakyMountResumesFromTheNewestCompleteAndEndsExact) {
  FaultFs storage;
  REQUIRE_FAULTFS(storage);
  TempDir dir;
  const std::string config = write_config(dir, small_config(1200, 40, 3));
  const std::vector<std::string> sets{"checkpoint.every_steps=4", "checkpoint.max_failures=20"};
  const std::string expected = reference_digest(dir, config, sets);
  const std::string ckpt = storage.path() + "/ckpt";
  const std::string slow = "delay write,fsync,rename 10\n";
  storage.set(slow + "error write EIO prob 0.05 path /.tmp-ckpt-\nseed 7");

  int survived = 0;
  std::vector<int64_t> complete_at_kill;
  std::vector<int64_t> resumed_at;  // each resumed process's step, from its own stderr
  for (int kill_number = 0; kill_number < 3; ++kill_number) {
    std::vector<std::string> args = with_sets({config, "--ckpt", ckpt}, sets);
    if (kill_number > 0) args.push_back("--resume");
    const std::string log = dir / ("run" + std::to_string(kill_number));
    // The writer pauses after this process's third save, so that a test scheduled late kills a
    // run that is still going rather than one that finished (whose resume would train nothing).
    const std::string before = slurp(ckpt + "/LATEST");
    const pid_t pid = start_gpurun(
        args, log, {{"GPURUN_FAULT", "sleep20:after_step:*,sleep300000:after_save:3"}});
    ASSERT_TRUE(wait_for_new_checkpoint(ckpt, pid, before, 120)) << slurp(log + ".err");
    ASSERT_TRUE(wait_for_new_checkpoint(ckpt, pid, slurp(ckpt + "/LATEST"), 120))
        << slurp(log + ".err");
    ::kill(pid, SIGKILL);
    Result killed = wait_gpurun(pid, log, 30);
    ASSERT_EQ(killed.signal, SIGKILL) << killed.err;
    if (kill_number > 0) resumed_at.push_back(resumed_step(killed.err));
    complete_at_kill.push_back(newest_complete_step(ckpt));
    ASSERT_GT(complete_at_kill.back(), 0);
    Result check = run_gpurun({"ckpt", "verify", ckpt});
    EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
    survived += check.exit_code == 0;
  }
  storage.set(slow);
  Result done = run_gpurun(with_sets({config, "--ckpt", ckpt, "--resume"}, sets));
  ASSERT_EQ(done.exit_code, 0) << done.err;
  resumed_at.push_back(resumed_step(done.err));
  // Each resume starts from the newest checkpoint complete at the kill, never an older one. The
  // steps come from stderr: a SIGKILL may take a `resume` event still queued for this slow
  // storage's metrics.jsonl with it (report/file_writer.h).
  ASSERT_EQ(resumed_at.size(), complete_at_kill.size());
  for (size_t i = 0; i < resumed_at.size(); ++i) EXPECT_EQ(resumed_at[i], complete_at_kill[i]) << i;
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""), expected);
  const auto counts = storage.injected();
  std::cout << "[ measured ] kills survived " << survived << "; faults injected: delay "
            << (counts.count("delay") ? counts.at("delay") : 0) << ", EIO "
            << (counts.count("EIO") ? counts.at("EIO") : 0) << "\n";
  EXPECT_GT(counts.count("delay") ? counts.at("delay") : 0, 0) << storage.log();
}

// The lease on slow storage (every operation waits 5 ms): a holder killed with SIGKILL is taken
// over at once by the next run on this host, which resumes from its newest checkpoint. When the
// storage then turns read-only, that run's lease expires and it stops with exit 1, and its
// newest complete checkpoint is still complete.
TEST(StorageFaults, ALeaseOnSlowStorageIsTakenOverFromAKilledHolderAndAReadOnlyTurnStopsTheRun) {
  FaultFs storage;
  REQUIRE_FAULTFS(storage);
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 50));  // 1000 steps
  const std::string ckpt = storage.path() + "/ckpt";
  const std::vector<std::string> sets{"checkpoint.lease_timeout=2", "checkpoint.every_steps=5",
                                      "checkpoint.max_failures=1000"};
  const Env slow_steps{{"GPURUN_FAULT", "sleep50:after_step:*"}};
  storage.set("delay * 5");
  const pid_t holder =
      start_gpurun(with_sets({config, "--ckpt", ckpt}, sets), dir / "holder", slow_steps);
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt, holder, "", 120)) << slurp(dir / "holder.err");
  ::kill(holder, SIGKILL);
  wait_gpurun(holder, dir / "holder", 30);
  const int64_t complete = newest_complete_step(ckpt);

  const auto start = std::chrono::steady_clock::now();
  const pid_t taker =
      start_gpurun(with_sets({config, "--ckpt", ckpt, "--resume", "--run-dir", dir / "run"}, sets),
                   dir / "taker", slow_steps);
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt, taker, slurp(ckpt + "/LATEST"), 120))
      << slurp(dir / "taker.err");
  const auto resumes = events(dir / "run", "resume");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_EQ(resumes[0].value("global_step", -1), complete);
  const std::string taken = slurp(dir / "taker.err");
  EXPECT_TRUE(contains(taken, "is gone from this host")) << taken;
  // Taken over at once: the dead holder's pid is checked, its heartbeat is not waited out.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30);

  storage.set("readonly");
  Result r = wait_gpurun(taker, dir / "taker", 120);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "the lease of " + ckpt + " expired")) << r.err;
  EXPECT_TRUE(contains(r.err, "Read-only file system")) << r.err;
  EXPECT_GT(storage.injected()["EROFS"], 0) << storage.log();
  storage.set("");
  Result verify = run_gpurun({"ckpt", "verify", ckpt});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
}

// data.path on flaky network storage, staged to a local disk: a read error while copying stops
// the run before training with exit 1 naming the file and the error, and leaves no partial copy
// that a later run could take for complete; with the storage merely slow, the next run stages
// every file again and trains the model an unstaged run trains.
TEST(StorageFaults, DataStagedFromAFlakyMountIsNeverTakenHalfCopiedAndTrainsTheSameModel) {
  FaultFs storage;
  REQUIRE_FAULTFS(storage);
  TempDir dir;
  for (const auto& e : fs::directory_iterator("/usr/share/datasets/fashion-mnist"))
    fs::copy_file(e.path(), storage.source() + "/" + e.path().filename().string());
  const std::string config = write_config(dir, small_config(600, 40, 1));
  const std::string stage = dir / "stage";
  const std::vector<std::string> sets{"data.path=" + storage.path(), "data.stage_dir=" + stage};
  Result reference =
      run_gpurun({config, "--ckpt", dir / "reference", "--set", "data.path=" + storage.path()});
  ASSERT_EQ(reference.exit_code, 0) << reference.err;

  storage.set("error read EIO after 3 path train-images");
  Result failed = run_gpurun(with_sets({config, "--ckpt", dir / "failed"}, sets));
  EXPECT_EQ(failed.exit_code, 1) << failed.err;
  EXPECT_TRUE(contains(failed.err, "train-images-idx3-ubyte.gz")) << failed.err;
  EXPECT_TRUE(contains(failed.err, "Input/output error")) << failed.err;
  EXPECT_GT(storage.injected()["EIO"], 0) << storage.log();
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(stage, ec))
    EXPECT_EQ(e.path().filename().string().find("train-images"), std::string::npos)
        << "a partial copy was left: " << e.path();

  storage.set("delay read 2");
  Result staged = run_gpurun(with_sets({config, "--ckpt", dir / "staged"}, sets));
  ASSERT_EQ(staged.exit_code, 0) << staged.err;
  const auto plan = events(dir / "staged", "plan");
  ASSERT_EQ(plan.size(), 1u);
  const nlohmann::json stage_result = plan[0]["data_stage"][0];
  EXPECT_GE(stage_result.value("copied_files", 0), 1) << stage_result.dump();
  EXPECT_EQ(stage_result.value("files", 0), 4) << stage_result.dump();
  const std::string copy = stage_result.value("copy", "");
  for (const auto& e : fs::directory_iterator(storage.source()))
    EXPECT_EQ(slurp(copy + "/" + e.path().filename().string()), slurp(e.path().string()));
  EXPECT_EQ(inspect(dir / "staged").value("model_digest", "x"),
            inspect(dir / "reference").value("model_digest", "y"));
}

}  // namespace
}  // namespace gpurun::test

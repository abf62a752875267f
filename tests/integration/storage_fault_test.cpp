// Storage that fails the way network storage does, through the kernel: --ckpt on faultfs
// (tests/tools/faultfs), a FUSE pass-through whose faults the test turns on while gpurun runs
// (issue 15). Label `faults`: `ctest -L faults`. Each test skips, saying why, where faultfs is
// not built or /dev/fuse is missing.
#include <signal.h>

#include <chrono>
#include <filesystem>
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

  const pid_t pid = start_gpurun(with_sets({config, "--ckpt", ckpt, "--run-dir", run}, sets),
                                 dir / "gpurun", {{"GPURUN_FAULT", "sleep30:after_step:*"}});
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

}  // namespace
}  // namespace gpurun::test

// The local tier in front of the network tier (checkpoint.local_dir, issue 11): every save is
// complete on the local disk first and copied to --ckpt in the background. Real processes,
// SIGKILL in the middle of the copy, and a network tier that turns read-only (a tmpfs
// remounted) under a running gpurun.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;

/// The one local tier under `local_dir` (a folder named after --ckpt), "" while none exists.
std::string tier_under(const std::string& local_dir) {
  std::error_code ec;
  if (!fs::is_directory(local_dir, ec)) return "";
  std::vector<std::string> tiers;
  for (const auto& e : fs::directory_iterator(local_dir, ec))
    if (e.is_directory()) tiers.push_back(e.path().string());
  EXPECT_LE(tiers.size(), 1u);
  return tiers.empty() ? "" : tiers.front();
}

std::vector<std::string> checkpoints_in(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

/// Every ckpt-* folder of `dir` verifies (gpurun ckpt verify --json); the problems otherwise.
std::string unverified(const std::string& dir) {
  Result r = run_gpurun({"ckpt", "verify", dir, "--json"});
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  if (j.is_discarded()) return "not JSON: " + r.out + r.err;
  std::string problems;
  for (const auto& row : j["checkpoints"])
    if (!row.value("complete", false)) problems += row.dump() + "\n";
  return problems;
}

TEST(Tiers, EverySaveIsCompleteLocallyFirstAndReachesTheNetworkTierUnchanged) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(1200, 40, 2));
  const std::vector<std::string> plain{"checkpoint.every_steps=10", "checkpoint.keep_last=2"};
  std::vector<std::string> tiered = plain;
  tiered.push_back("checkpoint.local_dir=" + (dir / "local"));
  tiered.push_back("checkpoint.local_keep_last=3");

  Result reference = run_gpurun(with_sets({config, "--ckpt", dir / "reference"}, plain));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  Result r = run_gpurun(with_sets({config, "--ckpt", dir / "net"}, tiered));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(inspect(dir / "net").value("model_digest", "?"),
            inspect(dir / "reference").value("model_digest", "!"));

  const std::string tier = tier_under(dir / "local");
  ASSERT_FALSE(tier.empty());
  EXPECT_EQ(fs::path(tier).filename().string().rfind("net-", 0), 0u) << tier;
  // The final checkpoint is in both tiers, the network copy's manifest byte for byte the local
  // one's; each tier keeps its own number.
  const std::string name = trimmed(slurp(dir / "net" + "/LATEST"));
  EXPECT_EQ(name, trimmed(slurp(tier + "/LATEST")));
  EXPECT_EQ(slurp(dir / "net" + "/" + name + "/manifest.json"),
            slurp(tier + "/" + name + "/manifest.json"));
  EXPECT_EQ(checkpoints_in(dir / "net").size(), 2u);
  EXPECT_EQ(checkpoints_in(tier).size(), 3u);
  EXPECT_EQ(unverified(dir / "net"), "");
  EXPECT_EQ(unverified(tier), "");

  // Saves go to the local tier; copies are reported apart.
  for (const auto& e : events(dir / "net", "checkpoint"))
    EXPECT_EQ(e.value("path", "").rfind(tier, 0), 0u) << e.dump();
  const auto copied = events(dir / "net", "checkpoint_copied");
  ASSERT_FALSE(copied.empty());
  EXPECT_EQ(copied.back().value("path", ""), dir / "net" + "/" + name);
  EXPECT_TRUE(events(dir / "net", "checkpoint_copy_failed").empty());

  // `ckpt list` of the network tier shows the local one too.
  Result list = run_gpurun({"ckpt", "list", dir / "net"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_TRUE(contains(list.out, "local tier " + tier)) << list.out;
  Result list_json = run_gpurun({"ckpt", "list", dir / "net", "--json"});
  const auto j = nlohmann::json::parse(list_json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << list_json.out;
  EXPECT_EQ(j["local_tier"]["dir"], tier);
  EXPECT_EQ(j["local_tier"]["newest_complete"], name);

  Result verify = run_gpurun({"ckpt", "verify", dir / "net"});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
  EXPECT_TRUE(contains(verify.out, "local tier " + tier)) << verify.out;

  // A local_dir that is a file: refused at the start, naming the key to fix.
  const std::string file = dir / "a-file";
  std::ofstream(file) << "x";
  Result bad =
      run_gpurun(with_sets({config, "--ckpt", dir / "net2"}, {"checkpoint.local_dir=" + file}));
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_TRUE(contains(bad.err, "choose a checkpoint.local_dir directory")) << bad.err;

  // A fresh run (no --resume) over a local tier that holds checkpoints is refused, naming it,
  // even when the network tier was emptied: nothing is silently continued or thrown away.
  fs::remove_all(dir / "net");
  Result fresh = run_gpurun(with_sets({config, "--ckpt", dir / "net"}, tiered));
  EXPECT_EQ(fresh.exit_code, 2) << fresh.err;
  EXPECT_TRUE(contains(fresh.err, tier)) << fresh.err;
  EXPECT_TRUE(contains(fresh.err, "--resume")) << fresh.err;
  EXPECT_EQ(checkpoints_in(tier).size(), 3u);
}

TEST(Tiers, SigkillAtRandomMomentsOfTheCopyLeavesNoHalfCheckpointAndEveryResumeSucceeds) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(2400, 40, 2));
  const std::vector<std::string> plain{"model.hidden=[256,256]", "checkpoint.every_steps=8"};
  std::vector<std::string> tiered = plain;
  tiered.push_back("checkpoint.local_dir=" + (dir / "local"));
  Result reference = run_gpurun(with_sets({config, "--ckpt", dir / "reference"}, plain));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const std::string expected = inspect(dir / "reference").value("model_digest", "");

  // Slow steps and a slow copy (before its rename), so that a kill lands inside the copy.
  const Env slow{{"GPURUN_FAULT", "sleep15:after_step:*,sleep150:copy_before_rename:*"}};
  const std::string net = dir / "net";
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> delay(0.0, 0.2);
  int killed = 0;
  Result last;
  for (int attempt = 0; attempt < 12; ++attempt) {
    pid_t pid = start_gpurun(with_sets({config, "--ckpt", net, "--resume"}, tiered), dir / "run",
                             killed < 4 ? slow : Env{});
    if (killed < 4 && wait_for_write_in_flight(net, pid, 60)) {
      sleep_for(delay(rng));
      kill(pid, SIGKILL);
      ++killed;
    }
    last = wait_gpurun(pid, dir / "run");
    // Whatever the moment: no half checkpoint under a final name in the network tier.
    EXPECT_EQ(unverified(net), "") << "after attempt " << attempt;
    if (last.exit_code == 0) break;
    ASSERT_EQ(last.signal, SIGKILL) << last.err;
  }
  EXPECT_GE(killed, 3);
  ASSERT_EQ(last.exit_code, 0) << last.err;
  EXPECT_EQ(inspect(net).value("model_digest", ""), expected);
  EXPECT_EQ(trimmed(slurp(net + "/LATEST")), trimmed(slurp(tier_under(dir / "local") + "/LATEST")));
}

TEST(Tiers, AnUnwritableNetworkTierNeitherStopsTrainingNorCountsAsAFailedSaveAndIsCaughtUp) {
  Tmpfs disk("64m", false);
  if (!disk.ok()) GTEST_SKIP() << "mount(tmpfs) is not permitted here";
  TempDir dir;
  const std::string config = write_config(dir, small_config(2400, 40, 2));
  const std::string net = disk.path() + "/ckpt";
  // max_failures 1: a copy failure counted as a failed save would stop the run at once.
  const std::vector<std::string> sets{"checkpoint.every_steps=5", "checkpoint.max_failures=1",
                                      "checkpoint.local_dir=" + (dir / "local")};
  const Env slow{{"GPURUN_FAULT", "sleep40:after_step:*"}};
  pid_t pid = start_gpurun(with_sets({config, "--ckpt", net, "--run-dir", dir / "run"}, sets),
                           dir / "run", slow);
  ASSERT_TRUE(wait_for_new_checkpoint(net, pid, "", 120)) << slurp(dir / "run.err");
  ASSERT_TRUE(disk.remount_read_only());
  // Two more saves complete in the local tier while the network tier cannot be written.
  const std::string tier = tier_under(dir / "local");
  ASSERT_FALSE(tier.empty());
  std::string local_latest = slurp(tier + "/LATEST");
  for (int saves = 0; saves < 2; ++saves) {
    ASSERT_TRUE(wait_for_new_checkpoint(tier, pid, local_latest, 60)) << slurp(dir / "run.err");
    local_latest = slurp(tier + "/LATEST");
  }
  // At least one copy attempt meets the read-only file system: its event, not a fixed wait.
  ASSERT_TRUE(wait_for_event(dir / "run", "checkpoint_copy_failed", {}, pid, 60))
      << slurp(dir / "run.err");
  ASSERT_TRUE(disk.remount_writable());
  Result r = wait_gpurun(pid, dir / "run");
  ASSERT_EQ(r.exit_code, 0) << r.err;

  const auto failed = events(dir / "run", "checkpoint_copy_failed");
  ASSERT_FALSE(failed.empty()) << r.err;
  EXPECT_EQ(failed.front().value("errno", 0), EROFS) << failed.front().dump();
  EXPECT_TRUE(events(dir / "run", "checkpoint_failed").empty());
  EXPECT_TRUE(contains(r.err, "caught up")) << r.err;
  // Caught up with the final checkpoint, and none half-written.
  const auto done = events(dir / "run", "done");
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(inspect(net)["global_step"], done.back()["global_step"]);
  EXPECT_EQ(unverified(net), "");
}

TEST(Tiers, ResumeTakesTheNewerTierEitherWayAndEndsWithTheUninterruptedDigest) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(1200, 40, 2));
  const std::vector<std::string> plain{"checkpoint.every_steps=10"};
  Result reference = run_gpurun(with_sets({config, "--ckpt", dir / "reference"}, plain));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const std::string expected = inspect(dir / "reference").value("model_digest", "");

  for (const std::string newer : {"local", "network"}) {
    SCOPED_TRACE("the newer tier: " + newer);
    const std::string net = dir / ("net-" + newer), local = dir / ("local-" + newer);
    const std::vector<std::string> tiered{"checkpoint.every_steps=10",
                                          "checkpoint.local_dir=" + local};
    Result first =
        run_gpurun(with_sets({config, "--ckpt", net, "--set", "train.epochs=1"}, tiered));
    ASSERT_EQ(first.exit_code, 0) << first.err;
    const std::string tier = tier_under(local);
    // The other tier loses its newest checkpoint (a reclaim before the copy, a wiped disk).
    const std::string older = newer == "local" ? net : tier;
    const std::string newest = trimmed(slurp(older + "/LATEST"));
    fs::remove_all(older + "/" + newest);
    Result resumed = run_gpurun(
        with_sets({config, "--ckpt", net, "--resume", "--set", "train.epochs=2"}, tiered));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_TRUE(contains(resumed.err, "resuming from the " + newer + " tier")) << resumed.err;
    EXPECT_TRUE(contains(resumed.err, newest)) << resumed.err;
    EXPECT_EQ(inspect(net).value("model_digest", ""), expected);
  }
}

// A local_keep_last lowered on a resume that takes the network tier's checkpoint trims the
// local disk at the resume, before the first save that must fit there.
TEST(Tiers, ALocalKeepLastLoweredOnAResumeFromTheNetworkTierAppliesToTheLocalDiskAtOnce) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(120, 30, 3));
  const std::string net = dir / "net", local = dir / "local";
  const std::vector<std::string> tiered{"checkpoint.local_dir=" + local, "checkpoint.keep_last=5"};
  Result first = run_gpurun(
      with_sets({config, "--ckpt", net, "--set", "checkpoint.local_keep_last=5"}, tiered));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string tier = tier_under(local);
  ASSERT_EQ(checkpoints_in(tier).size(), 3u);
  fs::remove_all(tier + "/ckpt-e0003-s0000012");  // the network tier is now the newer one
  const std::vector<std::string> network = checkpoints_in(net);
  ASSERT_EQ(network.back(), "ckpt-e0003-s0000012");
  // Extended by one epoch, killed after its first step, before any save.
  Result r = run_gpurun(with_sets({config, "--ckpt", net, "--resume", "--set", "train.epochs=4",
                                   "--set", "checkpoint.local_keep_last=1"},
                                  tiered),
                        {{"GPURUN_FAULT", "sigkill:after_step:*"}});
  ASSERT_EQ(r.signal, SIGKILL) << "exit " << r.exit_code << "\n" << r.err;
  EXPECT_TRUE(contains(r.err, "resuming from the network tier")) << r.err;
  EXPECT_EQ(checkpoints_in(tier), (std::vector<std::string>{"ckpt-e0002-s0000008"}));
  EXPECT_EQ(checkpoints_in(net), network);  // the network tier's retention is the copier's
}

// The local tier's newest checkpoint has one byte changed, which only its checksum finds: the
// resume finds it as it reads the files, sets it aside and resumes from the network tier's
// copy of the same step, exactly.
TEST(Tiers, ADamagedLocalCheckpointFoundAsItIsReadFallsBackToTheNetworkCopyOfTheSameStep) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(1200, 40, 2));
  Result reference =
      run_gpurun({config, "--ckpt", dir / "reference", "--set", "checkpoint.every_steps=10"});
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const std::vector<std::string> tiered{"checkpoint.every_steps=10",
                                        "checkpoint.local_dir=" + (dir / "local")};
  const std::string net = dir / "net";
  Result first = run_gpurun(with_sets({config, "--ckpt", net, "--set", "train.epochs=1"}, tiered));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string tier = tier_under(dir / "local");
  const std::string newest = trimmed(slurp(tier + "/LATEST"));
  ASSERT_EQ(trimmed(slurp(net + "/LATEST")), newest);
  flip_byte(tier + "/" + newest + "/model.pt", 1000);

  Result resumed =
      run_gpurun(with_sets({config, "--ckpt", net, "--resume", "--set", "train.epochs=2"}, tiered));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, tier + "/" + newest + " is damaged")) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, "does not match its manifest")) << resumed.err;
  EXPECT_TRUE(fs::is_directory(tier + "/" + newest + ".damaged"));
  const auto resumes = events(net, "resume");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_EQ(resumes.back()["path"], net + "/" + newest);
  EXPECT_EQ(inspect(net).value("model_digest", ""),
            inspect(dir / "reference").value("model_digest", ""));
}

TEST(Tiers, TheEndWaitsForTheFinalCopyAndAResumeOnTheSameMachineFinishesIt) {
  Tmpfs disk("64m", false);
  if (!disk.ok()) GTEST_SKIP() << "mount(tmpfs) is not permitted here";
  TempDir dir;
  const std::string config = write_config(dir, small_config(1200, 40, 1));
  const std::string net = disk.path() + "/ckpt";
  const std::vector<std::string> sets{"checkpoint.every_steps=5",
                                      "checkpoint.local_dir=" + (dir / "local")};
  // 100 ms a step: the remount (retried while busy) comes well before the final copy.
  pid_t pid = start_gpurun(with_sets({config, "--ckpt", net, "--run-dir", dir / "run"}, sets),
                           dir / "run", {{"GPURUN_FAULT", "sleep100:after_step:*"}});
  ASSERT_TRUE(wait_for_new_checkpoint(net, pid, "", 120)) << slurp(dir / "run.err");
  ASSERT_TRUE(disk.remount_read_only());
  // The network tier stays read-only to the end: the run cannot say it finished.
  Result r = wait_gpurun(pid, dir / "run");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "could not be copied to the network tier")) << r.err;
  EXPECT_TRUE(contains(r.err, "--resume")) << r.err;
  ASSERT_TRUE(disk.remount_writable());
  const std::string tier = tier_under(dir / "local");
  const std::string final_name = trimmed(slurp(tier + "/LATEST"));
  EXPECT_NE(trimmed(slurp(net + "/LATEST")), final_name);

  Result resumed =
      run_gpurun(with_sets({config, "--ckpt", net, "--run-dir", dir / "run", "--resume"}, sets));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, "resuming from the local tier")) << resumed.err;
  EXPECT_EQ(trimmed(slurp(net + "/LATEST")), final_name);
  EXPECT_EQ(inspect(net)["global_step"], 30);
  EXPECT_EQ(unverified(net), "");
}

TEST(Tiers, AStopSignalDuringTheFinalCopyEndsTheWaitWithExit75) {
  Tmpfs disk("64m", false);
  if (!disk.ok()) GTEST_SKIP() << "mount(tmpfs) is not permitted here";
  TempDir dir;
  const std::string config = write_config(dir, small_config(1200, 40, 1));
  const std::string net = disk.path() + "/ckpt";
  // 50 attempts: without the signal the end would wait about 100 s.
  const std::vector<std::string> sets{"checkpoint.every_steps=5", "checkpoint.max_failures=50",
                                      "checkpoint.local_dir=" + (dir / "local")};
  // 100 ms a step: the remount (retried while busy) comes well before the final copy.
  pid_t pid = start_gpurun(with_sets({config, "--ckpt", net, "--run-dir", dir / "run"}, sets),
                           dir / "run", {{"GPURUN_FAULT", "sleep100:after_step:*"}});
  ASSERT_TRUE(wait_for_new_checkpoint(net, pid, "", 120)) << slurp(dir / "run.err");
  ASSERT_TRUE(disk.remount_read_only());
  // Inside the final wait: the final save's checkpoint event follows the epoch's, as the end's
  // drain reports it, just before the wait for its copy (an event, not a fixed wait).
  const auto epoch = wait_for_event(dir / "run", "epoch", {}, pid, 120);
  ASSERT_TRUE(epoch) << slurp(dir / "run.err");
  ASSERT_TRUE(wait_for_event(
      dir / "run", "checkpoint",
      [&](const nlohmann::json& e) {
        return e.value("global_step", int64_t{-1}) == epoch->value("global_step", int64_t{-2}) &&
               e.value("time", 0.0) > epoch->value("time", 0.0);
      },
      pid, 60))
      << slurp(dir / "run.err");
  const auto signalled = std::chrono::steady_clock::now();
  kill(pid, SIGTERM);
  Result r = wait_gpurun(pid, dir / "run");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_LT(seconds, 10.0) << r.err;
  EXPECT_TRUE(contains(r.err, "while the final checkpoint was being copied")) << r.err;
  ASSERT_TRUE(disk.remount_writable());

  // The final state is only in the local tier: an export of --ckpt takes it from there.
  const nlohmann::json final_local = inspect(tier_under(dir / "local"));
  ASSERT_GT(final_local["global_step"].get<int64_t>(), inspect(net)["global_step"].get<int64_t>());
  Result exported = run_gpurun({"export", net, "--to", dir / "model.pt"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_TRUE(contains(exported.err, "exporting from the local tier")) << exported.err;
  EXPECT_TRUE(contains(exported.out + exported.err, final_local["model_digest"].get<std::string>()))
      << exported.out << exported.err;
}

}  // namespace
}  // namespace gpurun::test

// Issue 44, part 3: keep the best checkpoints, stop when the metric stops improving. The
// evaluation losses are scripted (GPURUN_TEST_EVAL_LOSS, util/faults.h), so that which epoch is
// best is known in advance; the rest is the real binary on real Fashion-MNIST files.
#include <csignal>
#include <cstdio>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// 200 samples in batches of 40: 5 optimizer steps an epoch, so that epoch i's (0-based)
// checkpoint is ckpt-e{i+1}-s{5 (i+1)}.
constexpr const char* kLosses = "5,3,4,2,6,1,7";
constexpr double kLossValues[] = {5, 3, 4, 2, 6, 1, 7};

std::string epoch_checkpoint(int epoch) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-e%04d-s%07d", epoch + 1, 5 * (epoch + 1));
  return name;
}

/// The checkpoint folders of `dir` (ckpt-*, nothing set aside), sorted.
std::vector<std::string> checkpoints(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("ckpt-", 0) == 0 && !contains(name, ".damaged"))
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

/// Whatever is left of a folder retention removed (.tmp-del-*), or any other temporary.
std::vector<std::string> temporaries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(".tmp-", 0) == 0)
      names.push_back(e.path().filename().string());
  return names;
}

std::vector<std::string> best_sets() {
  return {"checkpoint.keep_last=1", "checkpoint.keep_best.metric=eval_loss",
          "checkpoint.keep_best.k=2"};
}

/// The eval_loss a checkpoint folder's manifest records (extra.metrics).
double recorded_loss(const std::string& folder) {
  return inspect(folder)["extra"]["metrics"].value("eval_loss", -1.0);
}

// Losses 5, 3, 4, 2, 6, 1, 7 with k = 2 and keep_last = 1: exactly the checkpoints of 1 and 2
// and the last remain; `ckpt list` marks the two; `export --best` takes the one of 1, and the
// one of 2 once the first no longer verifies.
TEST(KeepBest, ScriptedLossesLeaveTheBestTwoAndTheLast) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(200, 40, 7));
  const std::string ckpt = dir / "ckpt";
  const Env env{{"GPURUN_TEST_EVAL_LOSS", kLosses}};
  Result r = run_gpurun(with_sets({config, "--ckpt", ckpt}, best_sets()), env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(checkpoints(ckpt), (std::vector<std::string>{epoch_checkpoint(3), epoch_checkpoint(5),
                                                         epoch_checkpoint(6)}));
  EXPECT_EQ(recorded_loss(ckpt + "/" + epoch_checkpoint(3)), 2.0);
  EXPECT_EQ(recorded_loss(ckpt + "/" + epoch_checkpoint(5)), 1.0);
  EXPECT_EQ(recorded_loss(ckpt + "/" + epoch_checkpoint(6)), 7.0);
  const json manifest = inspect(ckpt + "/" + epoch_checkpoint(5));
  EXPECT_TRUE(manifest["extra"]["metrics"].contains("eval_accuracy")) << manifest["extra"].dump();
  EXPECT_TRUE(manifest["extra"]["metrics"].contains("train_loss")) << manifest["extra"].dump();

  Result list = run_gpurun({"ckpt", "list", ckpt});
  EXPECT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(count_of(list.out, "best #"), 2u) << list.out;
  EXPECT_TRUE(contains(list.out, "best #1 eval_loss=1.0000")) << list.out;
  EXPECT_TRUE(contains(list.out, "best #2 eval_loss=2.0000")) << list.out;
  Result list_json = run_gpurun({"ckpt", "list", ckpt, "--json"});
  const json listed = json::parse(list_json.out);
  ASSERT_EQ(listed["checkpoints"].size(), 3u) << list_json.out;
  EXPECT_EQ(listed["checkpoints"][0]["best"], 2);
  EXPECT_EQ(listed["checkpoints"][1]["best"], 1);
  EXPECT_TRUE(listed["checkpoints"][2]["best"].is_null());

  Result best = run_gpurun({"export", ckpt, "--best", "--to", dir / "best.pt"});
  ASSERT_EQ(best.exit_code, 0) << best.err;
  EXPECT_TRUE(contains(best.out, epoch_checkpoint(5))) << best.out;
  // A flipped byte keeps the size: only the checksums find it, and --best reads them.
  flip_byte(ckpt + "/" + epoch_checkpoint(5) + "/model.pt", 100);
  Result next = run_gpurun({"export", ckpt, "--best", "--to", dir / "best.pt"});
  ASSERT_EQ(next.exit_code, 0) << next.err;
  EXPECT_TRUE(contains(next.out, epoch_checkpoint(3))) << next.out;
  EXPECT_TRUE(contains(next.err, "skipping")) << next.err;
  EXPECT_TRUE(contains(next.err, "does not verify")) << next.err;
  EXPECT_EQ(run_gpurun({"export", ckpt, "--best", "--step", "30", "--to", dir / "x.pt"}).exit_code,
            2);
}

// A run without keep_best records its metrics but names no best: --best says how to get one.
TEST(KeepBest, ExportBestWithoutKeepBestExits2) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(200, 40, 1));
  const std::string ckpt = dir / "ckpt";
  ASSERT_EQ(run_gpurun({config, "--ckpt", ckpt}).exit_code, 0);
  Result r = run_gpurun({"export", ckpt, "--best", "--to", dir / "best.pt"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "checkpoint.keep_best")) << r.err;
}

// SIGKILL between two removals of retention (sigkill:retention_remove:1), in every process of
// the run: each kill leaves the run resumable, no best checkpoint is ever lost, and the end is
// the same as without the kills.
TEST(KeepBest, SigkillDuringRetentionNeverLosesABest) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(200, 40, 7));
  const std::string ckpt = dir / "ckpt";
  const Env env{{"GPURUN_TEST_EVAL_LOSS", kLosses}, {"GPURUN_FAULT", "sigkill:retention_remove:1"}};
  int kills = 0;
  Result r;
  for (int attempt = 0; attempt < 8; ++attempt) {
    r = run_gpurun(with_sets({config, "--ckpt", ckpt, "--resume"}, best_sets()), env);
    if (r.exit_code == 0) break;
    ASSERT_EQ(r.signal, SIGKILL) << "exit " << r.exit_code << "\n" << r.err;
    ++kills;
    // Whatever the kill interrupted, the two best of the epochs saved so far are there.
    const std::vector<std::string> now = checkpoints(ckpt);
    ASSERT_FALSE(now.empty());
    const int saved = std::stoi(now.back().substr(6, 4));  // ckpt-eNNNN-...: epochs done
    std::vector<int> order(static_cast<size_t>(saved));
    for (int i = 0; i < saved; ++i) order[static_cast<size_t>(i)] = i;
    std::stable_sort(order.begin(), order.end(),
                     [](int a, int b) { return kLossValues[a] < kLossValues[b]; });
    for (size_t i = 0; i < std::min<size_t>(2, order.size()); ++i)
      EXPECT_TRUE(std::count(now.begin(), now.end(), epoch_checkpoint(order[i])))
          << epoch_checkpoint(order[i]) << " is gone after kill " << kills;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GE(kills, 1);
  EXPECT_EQ(checkpoints(ckpt), (std::vector<std::string>{epoch_checkpoint(3), epoch_checkpoint(5),
                                                         epoch_checkpoint(6)}));
  EXPECT_TRUE(temporaries(ckpt).empty());
  Result verify = run_gpurun({"ckpt", "verify", ckpt});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
}

/// The last epoch event's epoch, the done event, and the final model_digest of a run in `dir`.
struct Ending {
  int64_t last_epoch = -1;
  json done;
  std::string digest;
};

Ending ending(const std::string& run_dir, const std::string& ckpt) {
  Ending e;
  const std::vector<json> epochs = events(run_dir, "epoch");
  if (!epochs.empty()) e.last_epoch = epochs.back().value("epoch", int64_t{-1});
  const std::vector<json> done = events(run_dir, "done");
  if (!done.empty()) e.done = done.back();
  e.digest = inspect(ckpt).value("model_digest", "");
  return e;
}

/// Resumes a killed run (`args`, with the run dir and --ckpt `ckpt`) from global step `step` and
/// checks that it early-stops as the uninterrupted run did: the same last epoch and weights.
void expect_resumed_like(const std::vector<std::string>& args, const Env& env,
                         const std::string& ckpt, int step, const Ending& expected) {
  Result r = run_gpurun(args, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "global step " + std::to_string(step))) << r.err;
  const Ending resumed = ending(ckpt, ckpt);
  EXPECT_EQ(resumed.last_epoch, expected.last_epoch);
  EXPECT_EQ(resumed.done.value("reason", ""), "early_stop");
  EXPECT_EQ(resumed.digest, expected.digest);
}

// Patience 3 over 5, 3, 4, 2, 6, 1, 7, 8, 9, 0.5: best 1 after epoch 6 (1-based), then three
// epochs without an improvement: the run stops after epoch 9 of 10, killed and resumed or not,
// with the same weights.
TEST(EarlyStop, StopsAtTheSameEpochWithAndWithoutAKillAndResume) {
  const std::vector<std::string> sets{"train.early_stop.metric=eval_loss",
                                      "train.early_stop.patience=3", "checkpoint.every_steps=2",
                                      "checkpoint.async=false"};
  const Env scripted{{"GPURUN_TEST_EVAL_LOSS", "5,3,4,2,6,1,7,8,9,0.5"}};
  TempDir clean;
  const std::string config = write_config(clean, small_config(200, 40, 10));
  Result r = run_gpurun(with_sets({config, "--ckpt", clean / "ckpt"}, sets), scripted);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "early stop: eval_loss has not improved by more than 0 for 3 epochs "
                       "(best 1 after epoch 6); stopping after epoch 9 of 10"))
      << r.err;
  const Ending expected = ending(clean / "ckpt", clean / "ckpt");
  EXPECT_EQ(expected.last_epoch, 8);
  EXPECT_EQ(expected.done.value("reason", ""), "early_stop") << expected.done.dump();
  EXPECT_EQ(expected.done["early_stop"].value("best_epoch", -1), 5) << expected.done.dump();
  EXPECT_EQ(expected.done.value("exit_code", -1), 0);
  EXPECT_EQ(inspect(clean / "ckpt").value("global_step", 0), 45);
  const json status = json::parse(slurp(clean / "ckpt/status.json"));
  EXPECT_EQ(status.value("state", ""), "finished");
  EXPECT_EQ(status.value("reason", ""), "early_stop");

  // Killed in the middle of epoch 7 (1-based; steps 31 to 35), resumed from the step
  // checkpoint of step 32, whose count is that of epoch 6's end.
  TempDir killed;
  Env kill = scripted;
  kill["GPURUN_FAULT"] = "sigkill:after_step:33";
  const std::vector<std::string> args = with_sets(
      {write_config(killed, small_config(200, 40, 10)), "--ckpt", killed / "ckpt", "--resume"},
      sets);
  Result first = run_gpurun(args, kill);
  ASSERT_EQ(first.signal, SIGKILL) << first.err;
  expect_resumed_like(args, scripted, killed / "ckpt", 32, expected);

  // A resume of the stopped run trains nothing and stops again, for the same reason.
  Result again = run_gpurun(args, scripted);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(contains(again.err, "nothing left to train")) << again.err;
  EXPECT_EQ(ending(killed / "ckpt", killed / "ckpt").done.value("reason", ""), "early_stop");
  EXPECT_EQ(inspect(killed / "ckpt").value("global_step", 0), 45);
}

// Two ranks: rank 0's counter decides and is broadcast, so both ranks stop after the same
// epoch as one rank does, with no rank left waiting in a collective; killed and resumed, the
// same epoch and the same weights. Saves are synchronous, so that the kill after step 11
// always finds step 10's checkpoint committed.
TEST(EarlyStop, TwoRanksStopTogetherAtTheEpochOneRankStopsAt) {
  const std::vector<std::string> sets{"train.early_stop.metric=eval_loss",
                                      "train.early_stop.patience=2", "checkpoint.every_steps=2",
                                      "checkpoint.async=false"};
  const Env scripted{{"GPURUN_TEST_EVAL_LOSS", "5,3,4,2,6,7,1,0.5"}};
  TempDir dir;
  const std::string config = write_config(dir, small_config(200, 40, 8));
  const auto two = [&](const std::string& ckpt) {
    std::vector<std::string> args = with_sets({config, "--ckpt", ckpt, "--resume"}, sets);
    args.insert(args.end(), {"--nproc-per-node", "2"});
    return args;
  };
  Result r = run_gpurun(two(dir / "clean"), scripted);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Ending expected = ending(dir / "clean", dir / "clean");
  EXPECT_EQ(expected.last_epoch, 5);  // best 2 after epoch 4 (1-based), then 6 and 7
  EXPECT_EQ(expected.done.value("reason", ""), "early_stop") << expected.done.dump();
  EXPECT_EQ(inspect(dir / "clean").value("global_step", 0), 30);
  Result one = run_gpurun(with_sets({config, "--ckpt", dir / "one"}, sets), scripted);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(ending(dir / "one", dir / "one").last_epoch, expected.last_epoch);

  Env kill = scripted;
  kill["GPURUN_FAULT"] = "sigkill:after_step:11";
  Result first = run_gpurun(two(dir / "killed"), kill);
  EXPECT_NE(first.exit_code, 0) << first.err;
  expect_resumed_like(two(dir / "killed"), scripted, dir / "killed", 10, expected);
}

}  // namespace
}  // namespace gpurun::test

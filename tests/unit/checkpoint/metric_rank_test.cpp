// checkpoint.keep_best: the ranking of checkpoints by a metric their manifests record, and the
// retention that never deletes the best k (issue 44, part 3).
#include "checkpoint/format/metric_rank.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/storage/store.h"
#include "cli/ckpt_command.h"
#include "common/temp_dir.h"
#include "util/fs.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;
using Values = std::vector<std::optional<double>>;

TEST(BestIndices, RanksBestFirstAndKeepsTheOlderOnATie) {
  const Values values{5.0, 3.0, std::nullopt, 2.0, 3.0, 1.0};
  EXPECT_EQ(best_indices(values, "min", 2), (std::vector<size_t>{5, 3}));
  // 3.0 twice: the older (index 1) ranks before the newer (index 4).
  EXPECT_EQ(best_indices(values, "min", -1), (std::vector<size_t>{5, 3, 1, 4, 0}));
  EXPECT_EQ(best_indices(values, "max", 2), (std::vector<size_t>{0, 1}));
  EXPECT_EQ(best_indices(values, "min", 10).size(), 5u);  // the unranked entry is left out
  EXPECT_TRUE(best_indices({}, "min", 2).empty());
}

TEST(Improves, BeatsTheBestByMoreThanMinDelta) {
  EXPECT_TRUE(improves(1.0, std::nullopt, "min"));
  EXPECT_TRUE(improves(0.9, 1.0, "min"));
  EXPECT_FALSE(improves(1.0, 1.0, "min"));  // equal is no improvement
  EXPECT_FALSE(improves(0.95, 1.0, "min", 0.05));
  EXPECT_TRUE(improves(0.94, 1.0, "min", 0.05));
  EXPECT_TRUE(improves(0.8, 0.7, "max"));
  EXPECT_FALSE(improves(0.7, 0.8, "max"));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(improves(nan, 1.0, "min"));
  EXPECT_FALSE(improves(nan, std::nullopt, "min"));
}

TEST(ManifestMetric, ReadsExtraMetricsAndIgnoresWhatIsNoNumber) {
  const json manifest = {{"extra", {{"metrics", {{"eval_loss", 1.5}, {"train_loss", nullptr}}}}}};
  EXPECT_EQ(manifest_metric(manifest, "eval_loss"), 1.5);
  EXPECT_EQ(manifest_metric(manifest, "train_loss"), std::nullopt);  // a NaN, as JSON holds it
  EXPECT_EQ(manifest_metric(manifest, "eval_accuracy"), std::nullopt);
  EXPECT_EQ(manifest_metric(json{{"extra", json::object()}}, "eval_loss"), std::nullopt);
  EXPECT_EQ(manifest_metric(json(nullptr), "eval_loss"), std::nullopt);
}

TEST(ManifestKeepBest, ResolvesAutoByTheMetric) {
  json manifest = {
      {"config",
       {{"checkpoint",
         {{"keep_best", {{"metric", "eval_accuracy"}, {"mode", "auto"}, {"k", 3}}}}}}}};
  auto goal = manifest_keep_best(manifest);
  ASSERT_TRUE(goal);
  EXPECT_EQ(goal->mode, "max");
  EXPECT_EQ(goal->k, 3);
  manifest["config"]["checkpoint"]["keep_best"]["metric"] = "";
  EXPECT_FALSE(manifest_keep_best(manifest));
  EXPECT_FALSE(manifest_keep_best(json{{"config", json::object()}}));
}

/// A small checkpoint of `epoch` whose manifest records eval_loss `loss` (none: a step
/// checkpoint) and a config with keep_best {eval_loss, min, k}.
CheckpointSnapshot snapshot(int64_t epoch, int64_t step, std::optional<double> loss, int64_t k) {
  CheckpointSnapshot s;
  s.meta.epoch = epoch;
  s.meta.global_step = step;
  s.meta.config_hash = "0123456789abcdef";
  s.meta.config = {
      {"checkpoint", {{"keep_best", {{"metric", "eval_loss"}, {"mode", "min"}, {"k", k}}}}}};
  s.meta.model_digest = "fedcba9876543210";
  if (loss) s.meta.extra["metrics"] = {{"eval_loss", *loss}, {"eval_accuracy", 0.5}};
  s.files = {{"model.pt", std::string(512, static_cast<char>(step))}};
  return s;
}

std::vector<std::string> folders(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : stdfs::directory_iterator(dir))
    if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

KeepBestConfig keep_best(int64_t k) {
  KeepBestConfig best;
  best.metric = "eval_loss";
  best.mode = "min";
  best.k = k;
  return best;
}

// The script: eval losses 5, 3, 4, 2, 6, 1, 7 with k = 2 and keep_last = 1 leave exactly
// the checkpoints of 1 and 2 and the last; the step checkpoints between them, which record no
// metric, go by keep_last alone.
TEST(KeepBestRetention, KeepsTheBestKAndKeepLastsNewest) {
  test::TempDir tmp("keep-best");
  const std::string dir = tmp / "ckpt";
  CheckpointStore store(dir, 1);
  store.set_keep_best(keep_best(2));
  const std::vector<double> losses{5, 3, 4, 2, 6, 1, 7};
  for (size_t e = 0; e < losses.size(); ++e) {
    const int64_t step = static_cast<int64_t>(e + 1) * 10;
    store.save(snapshot(static_cast<int64_t>(e), step - 5, std::nullopt, 2));
    store.save(snapshot(static_cast<int64_t>(e + 1), step, losses[e], 2));
  }
  EXPECT_EQ(folders(dir), (std::vector<std::string>{checkpoint_name(4, 40), checkpoint_name(6, 60),
                                                    checkpoint_name(7, 70)}));
  // `gpurun ckpt list` marks them, best first.
  std::ostringstream text, as_json;
  ckpt_command("list", dir, false, text);
  EXPECT_NE(text.str().find("best #1 eval_loss=1.0000"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("best #2 eval_loss=2.0000"), std::string::npos) << text.str();
  ckpt_command("list", dir, true, as_json);
  const json listed = json::parse(as_json.str());
  ASSERT_EQ(listed["checkpoints"].size(), 3u);
  EXPECT_EQ(listed["checkpoints"][0]["best"], 2);
  EXPECT_EQ(listed["checkpoints"][1]["best"], 1);
  EXPECT_TRUE(listed["checkpoints"][2]["best"].is_null());
  EXPECT_EQ(listed["checkpoints"][2]["metric"], 7.0);
  EXPECT_EQ(listed["keep_best"]["metric"], "eval_loss");
}

// Without keep_best, keep_last alone decides, as before.
TEST(KeepBestRetention, OffKeepsKeepLastOnly) {
  test::TempDir tmp("keep-best");
  const std::string dir = tmp / "ckpt";
  CheckpointStore store(dir, 1);
  for (int64_t e = 0; e < 3; ++e) store.save(snapshot(e + 1, (e + 1) * 10, 1.0 - e * 0.1, 2));
  EXPECT_EQ(folders(dir), (std::vector<std::string>{checkpoint_name(3, 30)}));
}

// A folder whose manifest does not verify cannot be ranked: with keep_best on it is kept (it
// may be a best one), where keep_last alone deletes it.
TEST(KeepBestRetention, KeepsAnIncompleteFolderItCannotRank) {
  test::TempDir tmp("keep-best");
  const std::string dir = tmp / "ckpt";
  CheckpointStore store(dir, 1);
  store.set_keep_best(keep_best(1));
  store.save(snapshot(1, 10, 1.0, 1));
  store.save(snapshot(2, 20, 2.0, 1));
  const std::string manifest = dir + "/" + checkpoint_name(1, 10) + "/manifest.json";
  std::string text = fs::read_file(manifest);
  text[text.size() / 2] ^= 0x01;
  fs::write_file(manifest, text);
  store.save(snapshot(3, 30, 3.0, 1));
  store.save(snapshot(4, 40, 4.0, 1));
  // The damaged e1 is kept; e2 (2.0) is now the best that can be ranked; e4 is the last.
  EXPECT_EQ(folders(dir), (std::vector<std::string>{checkpoint_name(1, 10), checkpoint_name(2, 20),
                                                    checkpoint_name(4, 40)}));
}

}  // namespace
}  // namespace gpurun

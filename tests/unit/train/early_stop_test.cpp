// train.early_stop's counter (issue 44, part 3): Lightning's EarlyStopping semantics, and the
// state a checkpoint carries.
#include "train/early_stop.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace gpurun::detail {
namespace {

using json = nlohmann::json;

EarlyStopConfig loss_config(int64_t patience, double min_delta = 0) {
  EarlyStopConfig c;
  c.metric = "eval_loss";
  c.mode = "min";
  c.patience = patience;
  c.min_delta = min_delta;
  return c;
}

/// The 0-based epoch after which a run of `losses` stops, or -1.
int64_t stop_epoch(EarlyStop& stop, const std::vector<double>& losses) {
  for (size_t e = 0; e < losses.size(); ++e) {
    stop.observe(static_cast<int64_t>(e), {{"eval_loss", losses[e]}});
    if (stop.should_stop()) return static_cast<int64_t>(e);
  }
  return -1;
}

TEST(EarlyStop, StopsAfterPatienceEpochsWithoutImprovement) {
  EarlyStop stop(loss_config(3));
  // Best 1 after epoch 5 (0-based); 7, 8, 9 do not improve: the stop comes after epoch 8.
  EXPECT_EQ(stop_epoch(stop, {5, 3, 4, 2, 6, 1, 7, 8, 9, 0.5}), 8);
  EXPECT_EQ(stop.state()["best"], 1.0);
  EXPECT_EQ(stop.state()["best_epoch"], 5);
  EXPECT_EQ(stop.state()["epochs_without_improvement"], 3);
  EXPECT_EQ(stop.reason(8, 10),
            "early stop: eval_loss has not improved by more than 0 for 3 epochs (best 1 after "
            "epoch 6); stopping after epoch 9 of 10");
  EXPECT_EQ(stop.summary()["patience"], 3);
}

TEST(EarlyStop, MinDeltaAndModeMax) {
  EarlyStop delta(loss_config(2, 0.5));
  // 1.8 and 1.6 beat 2 by less than 0.5: two epochs without improvement.
  EXPECT_EQ(stop_epoch(delta, {2, 1.8, 1.6, 0.1}), 2);
  EarlyStopConfig acc;
  acc.metric = "eval_accuracy";
  acc.mode = "max";
  acc.patience = 1;
  EarlyStop stop(acc);
  stop.observe(0, {{"eval_accuracy", 0.5}});
  stop.observe(1, {{"eval_accuracy", 0.6}});
  EXPECT_FALSE(stop.should_stop());
  stop.observe(2, {{"eval_accuracy", 0.6}});
  EXPECT_TRUE(stop.should_stop());
}

TEST(EarlyStop, AMissingOrNaNValueIsNoImprovement) {
  EarlyStop stop(loss_config(2));
  stop.observe(0, {{"eval_loss", 1.0}});
  stop.observe(1, {{"eval_loss", nullptr}});
  stop.observe(2, json::object());
  EXPECT_TRUE(stop.should_stop());
}

// A resume continues the count; another metric or mode starts it afresh; off never stops.
TEST(EarlyStop, RestoresTheCountOfTheSameGoalOnly) {
  EarlyStop first(loss_config(3));
  first.observe(0, {{"eval_loss", 1.0}});
  first.observe(1, {{"eval_loss", 2.0}});
  first.observe(2, {{"eval_loss", 2.0}});
  const json state = first.state();

  EarlyStop resumed(loss_config(3));
  resumed.restore(state);
  EXPECT_FALSE(resumed.should_stop());
  resumed.observe(3, {{"eval_loss", 3.0}});
  EXPECT_TRUE(resumed.should_stop());

  EarlyStop lowered(loss_config(2));  // a resume may lower the patience: it stops at once
  lowered.restore(state);
  EXPECT_TRUE(lowered.should_stop());

  EarlyStopConfig other = loss_config(3);
  other.metric = "train_loss";
  EarlyStop changed(other);
  changed.restore(state);
  EXPECT_EQ(changed.state()["epochs_without_improvement"], 0);
  EXPECT_TRUE(changed.state()["best"].is_null());

  EarlyStop off(EarlyStopConfig{});
  off.restore(state);
  off.observe(3, {{"eval_loss", 9.0}});
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.should_stop());
}

}  // namespace
}  // namespace gpurun::detail

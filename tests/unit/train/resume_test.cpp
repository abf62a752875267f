// Unit tests of what a resume keeps of the run (issue 31, items 4 and 5): the step events'
// interval carried through a checkpoint, and a train.epochs that ends before the checkpoint.
#include <gtest/gtest.h>

#include "gpurun/config.h"
#include "gpurun/errors.h"
#include "train/resume.h"
#include "train/step_metrics.h"

namespace gpurun {
namespace {

// Losses whose sum depends on the order of the additions, so that only the same sums in the
// same order give the same mean to the bit.
constexpr double kLoss[] = {
    2.3025850929940455, 1.1, 0.7000000000000001, 0.3333333333333333, 0.1, 1e-17, 0.9};

TEST(StepMetrics, ACarriedIntervalGivesTheUninterruptedMeanAndTraffic) {
  StepMetrics full;
  full.start(0, 10);
  for (int64_t s = 1; s <= 2; ++s) full.add(s, kLoss[s - 1], 30);
  full.close_interval();
  for (int64_t s = 3; s <= 7; ++s) {
    full.add_traffic({1, 2, 100});
    full.add(s, kLoss[s - 1], s == 7 ? 10 : 30);
  }
  const StepMetrics::Interval want = full.close_interval();

  // Killed after a checkpoint of step 4, resumed in another process.
  StepMetrics killed;
  killed.start(0, 10);
  for (int64_t s = 1; s <= 2; ++s) killed.add(s, kLoss[s - 1], 30);
  killed.close_interval();
  for (int64_t s = 3; s <= 4; ++s) {
    killed.add_traffic({1, 2, 100});
    killed.add(s, kLoss[s - 1], 30);
  }
  // Through the manifest's JSON text, as a checkpoint carries it.
  const nlohmann::json carried = nlohmann::json::parse(killed.interval_state().dump());
  EXPECT_EQ(carried["since_step"], 2);
  EXPECT_EQ(carried["until_step"], 4);
  StepMetrics resumed;
  resumed.start(4, 10);
  ASSERT_TRUE(resumed.continue_interval(carried));
  for (int64_t s = 5; s <= 7; ++s) {
    resumed.add_traffic({1, 2, 100});
    resumed.add(s, kLoss[s - 1], s == 7 ? 10 : 30);
  }
  const StepMetrics::Interval got = resumed.close_interval();
  EXPECT_EQ(got.mean_loss, want.mean_loss);
  EXPECT_EQ(got.steps, 5);
  EXPECT_EQ(got.traffic.gradient_syncs, 5);
  EXPECT_EQ(got.traffic.all_reduce_calls, 10);
  EXPECT_EQ(got.traffic.all_reduce_bytes, 500);

  // Without the carry (an older checkpoint) the event covers the resumed steps only.
  StepMetrics old;
  old.start(4, 10);
  for (int64_t s = 5; s <= 7; ++s) old.add(s, kLoss[s - 1], s == 7 ? 10 : 30);
  const StepMetrics::Interval alone = old.close_interval();
  EXPECT_EQ(alone.steps, 3);
  EXPECT_NE(alone.mean_loss, want.mean_loss);
}

TEST(StepMetrics, AnIntervalThatDoesNotEndAtTheResumedStepIsNotContinued) {
  StepMetrics m;
  m.start(4, 10);
  const nlohmann::json good = {
      {"since_step", 2}, {"until_step", 4}, {"loss_sum", 1.5}, {"samples", 60}};
  for (const nlohmann::json& bad :
       {nlohmann::json(), nlohmann::json("x"), nlohmann::json{{"since_step", 2}},
        nlohmann::json{{"since_step", 2}, {"until_step", 5}, {"loss_sum", 1.5}, {"samples", 60}},
        nlohmann::json{{"since_step", 5}, {"until_step", 4}, {"loss_sum", 1.5}, {"samples", 60}},
        nlohmann::json{{"since_step", 2}, {"until_step", 4}, {"loss_sum", "1"}, {"samples", 60}},
        nlohmann::json{{"since_step", 2}, {"until_step", 4}, {"loss_sum", 1.5}, {"samples", -1}},
        nlohmann::json{
            {"since_step", 2}, {"until_step", 4}, {"loss_sum", 1.5}, {"all_reduce_calls", 0.5}}})
    EXPECT_FALSE(m.continue_interval(bad)) << bad;
  EXPECT_TRUE(m.continue_interval(good));
  m.add(5, 0.5, 30);
  const StepMetrics::Interval i = m.close_interval();
  EXPECT_EQ(i.steps, 3);
  EXPECT_DOUBLE_EQ(i.mean_loss, (1.5 + 15.0) / 90);
}

/// A checkpoint of a run of `epochs` epochs at `epoch`, `position` samples into it, after
/// `step` optimizer steps.
LoadedCheckpoint checkpoint_of(const RunConfig& config, int64_t epochs, int64_t epoch,
                               int64_t position, int64_t step) {
  RunConfig saved = config;
  saved.train.epochs = epochs;
  LoadedCheckpoint c;
  c.info.path = "/ckpt/ckpt-e" + std::to_string(epoch) + "-s" + std::to_string(step);
  c.meta.epoch = epoch;
  c.meta.position_in_epoch = position;
  c.meta.global_step = step;
  c.meta.config = config_to_json(saved);
  return c;
}

TEST(CheckResumable, FewerStepsThanTheCheckpointHasDoneAreRefusedNamingBoth) {
  RunConfig config;
  config.train.batch_size = 30;
  const int64_t per_epoch = steps_per_epoch(config, 90);
  ASSERT_EQ(per_epoch, 3);
  EXPECT_EQ(steps_per_epoch(config, 91), 4);

  config.train.epochs = 1;
  // Mid-epoch 1 (step 4): one epoch of 3 steps is too short.
  try {
    check_resumable(config, checkpoint_of(config, 3, 1, 30, 4), per_epoch);
    ADD_FAILURE() << "no ResumeError";
  } catch (const ResumeError& e) {
    const std::string what = e.what();
    for (const char* part : {"train.epochs 1 gives 3 optimizer steps (3 per epoch)",
                             "global step 4 (in epoch 1, 30 samples into it)", "at least 2"})
      EXPECT_NE(what.find(part), std::string::npos) << part << "\n" << what;
    EXPECT_EQ(exit_code_for(e), 3);
  }
  // After 2 whole epochs (step 6).
  EXPECT_THROW(check_resumable(config, checkpoint_of(config, 2, 2, 0, 6), per_epoch), ResumeError);
  config.train.epochs = 2;
  EXPECT_THROW(check_resumable(config, checkpoint_of(config, 3, 2, 30, 7), per_epoch), ResumeError);
  // Exactly the checkpoint's step: nothing left to train, accepted.
  EXPECT_NO_THROW(check_resumable(config, checkpoint_of(config, 3, 2, 0, 6), per_epoch));
  // More: resumes, lowered or raised.
  EXPECT_NO_THROW(check_resumable(config, checkpoint_of(config, 3, 1, 30, 4), per_epoch));
  config.train.epochs = 5;
  EXPECT_NO_THROW(check_resumable(config, checkpoint_of(config, 2, 2, 0, 6), per_epoch));
}

}  // namespace
}  // namespace gpurun

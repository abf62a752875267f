// Unit tests of what a resume keeps of the run (issue 31, item 4): a train.epochs that ends
// before the checkpoint.
#include <gtest/gtest.h>

#include "gpurun/config.h"
#include "gpurun/errors.h"
#include "train/resume.h"

namespace gpurun {
namespace {

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

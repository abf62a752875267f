// checkpoint.every_minutes: auto (checkpoint/interval.h): Young/Daly's interval.
#include "checkpoint/interval.h"

#include <cmath>

#include <gtest/gtest.h>

namespace gpurun {
namespace {

TEST(CheckpointInterval, IsYoungDalysSquareRootOfTwiceTheSaveCostTimesTheMtbf) {
  // A 1 s save and a reclaim every 6 h: sqrt(2 x 1 x 21600) = 207.8 s, about 3.5 minutes.
  EXPECT_NEAR(young_daly_seconds(1.0, 6 * 3600.0), 207.846, 1e-3);
  // A 30 s synchronous save to a NAS with a 1 h MTBF: sqrt(2 x 30 x 3600) = 464.8 s.
  EXPECT_NEAR(young_daly_seconds(30.0, 3600.0), 464.758, 1e-3);
  // A hundredth of the cost: a tenth of the interval.
  EXPECT_NEAR(young_daly_seconds(0.01, 6 * 3600.0), young_daly_seconds(1.0, 6 * 3600.0) / 10, 1e-9);
  // A four times more reliable machine: twice the interval.
  EXPECT_NEAR(young_daly_seconds(2.0, 24 * 3600.0), 2 * young_daly_seconds(2.0, 6 * 3600.0), 1e-9);
}

}  // namespace
}  // namespace gpurun

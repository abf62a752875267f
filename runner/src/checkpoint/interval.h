// checkpoint.every_minutes: auto. The interval between saves that minimises the expected time
// lost to failures plus the time spent saving, to first order (Young 1974, "A first order
// approximation to the optimum checkpoint interval", CACM 17(9); Daly 2006, "A higher order
// estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3)):
//
//     interval = sqrt(2 × save_cost × MTBF)
//
// save_cost: the seconds a save takes from training (the stall; a synchronous save's stall
// includes its write). MTBF: the mean time between failures (checkpoint.mtbf_hours).
#pragma once

#include <cmath>

namespace gpurun {

/// Young/Daly's interval in seconds for a save cost and an MTBF in seconds (both > 0).
inline double young_daly_seconds(double save_cost_seconds, double mtbf_seconds) {
  return std::sqrt(2.0 * save_cost_seconds * mtbf_seconds);
}

/// Until a save is measured, `auto` assumes that a save costs this many seconds.
inline constexpr double kAssumedSaveSeconds = 1.0;

}  // namespace gpurun

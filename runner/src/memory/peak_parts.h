// The peak of each part of a run (training steps, evaluation, checkpoint capture) from one
// memory meter, as the planner probed them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "memory/meter.h"
#include "memory/planner.h"

namespace gpurun {

/// The meter's peak split by what the run is doing, so that an epoch reports the peak of each
/// part the planner probed (training steps, evaluation, checkpoint capture) and, as their
/// largest, its own peak. A part is a member of MeasuredPeaks; null: a stretch not counted
/// (the epoch hooks, the plugin's own code, which no probe runs).
class PeakParts {
 public:
  using Part = int64_t MeasuredPeaks::*;
  explicit PeakParts(MemoryMeter& meter) : meter_(meter) {}

  /// Forgets every part and starts measuring `part`.
  void restart(Part part) {
    peaks_ = {};
    meter_.reset_peak();
    part_ = part;
  }
  /// Ends the part in progress and starts `part`; returns the part that ended.
  Part enter(Part part) {
    record();
    meter_.reset_peak();
    return std::exchange(part_, part);
  }
  /// The peak of each part since restart(), the one in progress included.
  MeasuredPeaks peaks() {
    record();
    return peaks_;
  }

 private:
  void record() {
    if (part_) peaks_.*part_ = std::max(peaks_.*part_, meter_.peak_bytes());
  }

  MemoryMeter& meter_;
  MeasuredPeaks peaks_;
  Part part_ = nullptr;
};

}  // namespace gpurun

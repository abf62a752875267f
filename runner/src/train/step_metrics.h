// The numbers of the step events and of the progress line: the samples per second and the mean
// loss over the wall time since the last step event, and the time left at this process's mean
// time per step.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace gpurun {

class StepMetrics {
 public:
  /// What a step event reports of the optimizer steps since the last one.
  struct Interval {
    double mean_loss = 0;           ///< over its samples (each step's mean loss x its samples)
    double samples_per_second = 0;  ///< over the wall time since the last event, which
                                    ///< includes epoch ends, evaluation and saves
    int64_t steps = 0;              ///< optimizer steps it covers
    double time = 0;                ///< Unix seconds at its last step: what the rate runs to
  };

  /// Training starts now, at `global_step` of `total_steps`: rates and the ETA count from here.
  void start(int64_t global_step, int64_t total_steps);

  /// An optimizer step ended now: `global_step` steps are done, the last of mean `loss` over
  /// `samples` samples.
  void add(int64_t global_step, double loss, int64_t samples);

  /// Ends the interval at the last add() and starts the next one there.
  Interval close_interval();

  /// Seconds left at the mean time per step of this process at the last add(), evaluation and
  /// saves included; -1 before the first step.
  double eta_seconds() const;

  /// "epoch E/N  step S/T  loss L  R samples/s  ETA D": the last step's loss, the last
  /// interval's rate (before the first one closes: the rate so far).
  std::string progress_line(int64_t epoch, int64_t epochs) const;

  /// The loss of this process's last optimizer step; nullopt before it.
  std::optional<double> last_loss() const { return last_loss_; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_ = Clock::now();  ///< training's start in this process
  int64_t first_step_ = 0;                  ///< the global step it started from
  int64_t total_steps_ = 0;
  int64_t global_step_ = 0;
  Clock::time_point step_end_ = start_;  ///< the last add()
  double step_end_time_ = 0;             ///< the same in Unix seconds
  std::optional<double> last_loss_;
  Clock::time_point interval_start_ = start_;  ///< the last closed interval's end (or the start)
  int64_t interval_first_step_ = 0;
  int64_t interval_samples_ = 0;
  double interval_loss_ = 0, throughput_ = 0;
};

}  // namespace gpurun

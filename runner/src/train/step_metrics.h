// The numbers of the step events and of the progress line: the mean loss and the gradient
// synchronisation's traffic per optimizer step since the last step event, the samples per
// second over the wall time since it, and the time left at this process's mean time per step.
//
// The interval since the last step event is carried across a resume (interval_state() into the
// checkpoint, continue_interval() out of it), so that the first event after a resume covers the
// same steps as the uninterrupted run's and reports the same mean loss and traffic to the bit:
// the sums are added in the same order. The rates and the ETA are this process's wall time and
// cannot be carried (docs/architecture.md, "Run directory").
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace gpurun {

/// What the gradient synchronisation moved (a distributed run's CollectiveStats, counted over the
/// sync_gradients() calls of the training steps only).
struct SyncTraffic {
  int64_t gradient_syncs = 0;    ///< sync_gradients() rounds
  int64_t all_reduce_calls = 0;  ///< c10d all-reduce calls they made
  int64_t all_reduce_bytes = 0;  ///< bytes of the tensors they reduced
  /// Bytes this rank sent by the ring model (CollectiveStats::moved_bytes): the measure on
  /// which a sharded step and DDP's compare.
  int64_t moved_bytes = 0;
};

class StepMetrics {
 public:
  /// What a step event reports of the optimizer steps since the last one.
  struct Interval {
    double mean_loss = 0;           ///< over its samples (each step's mean loss x its samples)
    double samples_per_second = 0;  ///< this process's samples over the wall time since the
                                    ///< last event (or its start), which includes epoch ends,
                                    ///< evaluation and saves
    int64_t steps = 0;              ///< optimizer steps it covers
    double time = 0;                ///< Unix seconds at its last step: what the rate runs to
    SyncTraffic traffic;            ///< the gradient synchronisation's, over its steps
    /// Seconds the training thread blocked waiting for its batches (data/loader.h), summed per
    /// optimizer step and averaged over this process's steps of the interval; -1: none here.
    double data_wait_seconds = -1;

    /// The step event's fields of it: `loss`, `samples_per_second`, `time` and, in a run of
    /// `world_size` > 1 ranks, `world_size` and the traffic per optimizer step
    /// (`gradient_syncs_per_step`, `all_reduce_calls_per_step`, `all_reduce_bytes_per_step`,
    /// `moved_bytes_per_step`), and `data_wait_seconds` when this process trained a step of it.
    nlohmann::json event_fields(int world_size) const;
  };

  /// Training starts now, at `global_step` of `total_steps`: rates and the ETA count from here.
  void start(int64_t global_step, int64_t total_steps);

  /// Continues the interval a checkpoint carried (interval_state() of the process that saved
  /// it), after start() at the checkpoint's step: the next event covers the steps since the
  /// last event before the checkpoint. Returns false, changing nothing, when `state` is not an
  /// interval that ends at that step (a checkpoint written before gpurun carried it: the next
  /// event then covers the resumed steps only, as before).
  bool continue_interval(const nlohmann::json& state);

  /// An optimizer step ended now: `global_step` steps are done, the last of mean `loss` over
  /// `samples` samples.
  void add(int64_t global_step, double loss, int64_t samples);

  /// Adds the data wait of the step just ended (add()) to the interval: `seconds` the training
  /// thread blocked for its batches.
  void add_data_wait(double seconds);

  /// Adds the gradient synchronisation of the step in progress to the interval.
  void add_traffic(const SyncTraffic& traffic);

  /// Ends the interval at the last add() and starts the next one there.
  Interval close_interval();

  /// The open interval as a checkpoint carries it: `since_step` (the last step event's global
  /// step, or where training started), `loss_sum`, `samples`, and the traffic's three counts.
  nlohmann::json interval_state() const;

  /// Seconds left at the mean time per step of this process at the last add(), evaluation and
  /// saves included; -1 before the first step.
  double eta_seconds() const;

  /// "epoch E/N  step S/T  loss L  R samples/s  ETA D": L is `epoch_loss`, the epoch's mean
  /// loss so far (per sample), so that the epoch's last line shows the epoch's train loss and
  /// not that of its short last batch alone; R is the last interval's rate (before the first
  /// one closes: the rate so far).
  std::string progress_line(int64_t epoch, int64_t epochs, double epoch_loss) const;

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
  int64_t interval_first_step_ = 0;            ///< the global step the interval starts after
  int64_t interval_samples_ = 0;               ///< its samples, carried ones included
  double interval_loss_ = 0;                   ///< their sum of loss x samples
  SyncTraffic interval_traffic_;
  int64_t rate_samples_ = 0;  ///< the interval's samples trained by this process
  double wait_seconds_ = 0;   ///< the data wait of this process's steps of the interval
  int64_t wait_steps_ = 0;    ///< those steps (a resumed interval's carried ones excluded)
  double throughput_ = 0;
};

}  // namespace gpurun

// train.early_stop: the counter of epochs without an improvement of a metric, and the decision
// to stop (Lightning's EarlyStopping(monitor, mode, patience, min_delta): an improvement beats
// the best by more than min_delta). Its state travels in every checkpoint (the manifest's
// extra.early_stop), so that a resumed run stops after the same epoch as an uninterrupted one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "gpurun/config.h"

namespace gpurun::detail {

class EarlyStop {
 public:
  /// `config` as resolved (mode min or max); a metric of "" is off.
  explicit EarlyStop(EarlyStopConfig config);

  bool enabled() const { return !config_.metric.empty(); }

  /// Takes the metrics of the 0-based epoch `epoch` ({eval_loss, eval_accuracy, train_loss},
  /// as the epoch event has them): the best so far and the count of epochs in a row without an
  /// improvement. A missing or NaN value counts as no improvement.
  void observe(int64_t epoch, const nlohmann::json& metrics);

  /// Whether the run stops now: enabled, and `patience` epochs in a row without an improvement
  /// (under the patience configured now: a resume may raise it and train on).
  bool should_stop() const;

  /// What a checkpoint keeps: {metric, mode, best (null: none yet), best_epoch,
  /// epochs_without_improvement}.
  nlohmann::json state() const;

  /// Continues from a checkpoint's state(); a state of another metric or mode (the config
  /// changed at the resume) or none at all starts the count afresh, logged.
  void restore(const nlohmann::json& state);

  /// The line that says why the run stops, after the 0-based epoch `epoch` of `epochs`:
  /// "early stop: eval_loss has not improved by more than 0 for 3 epochs (best 1 after epoch
  /// 6); stopping after epoch 9 of 10".
  std::string reason(int64_t epoch, int64_t epochs) const;

  /// What the done event and status.json say of an early stop: the metric, mode, best,
  /// best_epoch (0-based), patience, min_delta, epochs_without_improvement.
  nlohmann::json summary() const;

 private:
  EarlyStopConfig config_;
  std::optional<double> best_;
  int64_t best_epoch_ = -1;
  int64_t without_improvement_ = 0;
};

}  // namespace gpurun::detail

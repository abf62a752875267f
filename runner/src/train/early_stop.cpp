#include "train/early_stop.h"

#include <cmath>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpoint/format/metric_rank.h"

namespace gpurun::detail {

EarlyStop::EarlyStop(EarlyStopConfig config) : config_(std::move(config)) {}

void EarlyStop::observe(int64_t epoch, const nlohmann::json& metrics) {
  if (!enabled()) return;
  const auto found = metrics.find(config_.metric);
  const double value = found != metrics.end() && found->is_number()
                           ? found->get<double>()
                           : std::numeric_limits<double>::quiet_NaN();
  if (improves(value, best_, config_.mode, config_.min_delta)) {
    best_ = value;
    best_epoch_ = epoch;
    without_improvement_ = 0;
  } else {
    ++without_improvement_;
  }
}

bool EarlyStop::should_stop() const {
  return enabled() && without_improvement_ >= config_.patience;
}

nlohmann::json EarlyStop::state() const {
  return {{"metric", config_.metric},
          {"mode", config_.mode},
          {"best", best_ ? nlohmann::json(*best_) : nlohmann::json()},
          {"best_epoch", best_epoch_},
          {"epochs_without_improvement", without_improvement_}};
}

void EarlyStop::restore(const nlohmann::json& state) {
  best_.reset();
  best_epoch_ = -1;
  without_improvement_ = 0;
  if (!enabled()) return;
  if (!state.is_object()) {
    spdlog::info("early stop: the checkpoint holds no count of {}; counting from this epoch",
                 config_.metric);
    return;
  }
  const std::string metric = state.value("metric", std::string());
  const std::string mode = state.value("mode", std::string());
  if (metric != config_.metric || mode != config_.mode) {
    spdlog::info(
        "early stop: the checkpoint counted {} ({}), this run watches {} ({}); counting afresh",
        metric, mode, config_.metric, config_.mode);
    return;
  }
  if (state.contains("best") && state["best"].is_number()) best_ = state["best"].get<double>();
  best_epoch_ = state.value("best_epoch", int64_t{-1});
  without_improvement_ = state.value("epochs_without_improvement", int64_t{0});
}

std::string EarlyStop::reason(int64_t epoch, int64_t epochs) const {
  const std::string best =
      best_ ? fmt::format("best {:g} after epoch {}", *best_, best_epoch_ + 1) : "no best yet";
  return fmt::format(
      "early stop: {} has not improved by more than {:g} for {} epochs ({}); stopping after "
      "epoch {} of {}",
      config_.metric, config_.min_delta, without_improvement_, best, epoch + 1, epochs);
}

nlohmann::json EarlyStop::summary() const {
  return {{"metric", config_.metric},
          {"mode", config_.mode},
          {"best", best_ ? nlohmann::json(*best_) : nlohmann::json()},
          {"best_epoch", best_epoch_},
          {"patience", config_.patience},
          {"min_delta", config_.min_delta},
          {"epochs_without_improvement", without_improvement_}};
}

}  // namespace gpurun::detail

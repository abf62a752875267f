// `gpurun plan CONFIG [--memory-limit SIZE] [--json]`: what the run needs and where it fits.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "forecast/cards.h"
#include "gpurun/config.h"

namespace gpurun {

class Registry;

/// Measures the configured run (the probes of memory_plan.h on the real model and data),
/// prints the chosen plan for this device, the measured peak beside the analytic estimate
/// and its breakdown, the measured step time and the ETA of the whole run, and for common
/// rental card whether the run fits as configured, with which plan, or not at all (predicted
/// from the line peak(b) = fixed + b x per_sample through the probes), and the time and cost. With
/// `json`, one object: the plan event's fields plus "breakdown", "cards", "step_seconds",
/// "eta_seconds". Returns the exit code; throws ConfigError when nothing fits this device. What
/// `gpurun plan` forecasts on, besides the run.
struct PlanOptions {
  std::vector<Card> cards = bundled_cards();  ///< --cards FILE, else examples/cards.yaml
  double deadline_hours = 72;                 ///< --deadline HOURS: more is worth more cards
  bool estimate_only = false;                 ///< --estimate-only: build nothing, run nothing
};

/// With `options.estimate_only`, or when the model's weights alone do not fit this device, the
/// model is built without its weights (model/without_weights.h) and planned from the estimate
/// (memory/peak_probe.h) alone: nothing is run; the JSON has "estimate_only": true and the
/// breakdowns without and with activation checkpointing. Either way "cards" holds a
/// CardForecast (forecast/forecast.h) for every card.
int plan_command(const RunConfig& config, const std::string& device, int64_t memory_limit,
                 bool json, const Registry& registry, const PlanOptions& options,
                 std::ostream& out);

}  // namespace gpurun

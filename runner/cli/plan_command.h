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

/// Measures the configured run (the plan's own probes, run_setup.h's make_plan, on the real
/// model and data), prints the chosen plan for this device, the measured peak beside the
/// analytic estimate and its breakdown, the measured time of an optimizer step and the ETA of
/// the whole run, and for each rental card whether the run fits as configured, with which plan,
/// or not at all (predicted from the line peak(b) = fixed + b x per_sample through the measured
/// training peak, with the estimate's activations per sample as its slope), and the time and
/// cost. With `json`, one object: the plan event's fields plus "breakdown", "cards",
/// "step_seconds" (per micro-batch, as in the plan event), "optimizer_step_seconds",
/// "eta_seconds", "seconds" (the plan's own wall time) and "host_peak_rss_bytes". Returns the
/// exit code. What `gpurun plan` forecasts on, besides the run.
struct PlanOptions {
  std::vector<Card> cards = bundled_cards();  ///< --cards FILE, else examples/cards.yaml
  double deadline_hours = 72;                 ///< --deadline HOURS: more is worth more cards
  bool estimate_only = false;                 ///< --estimate-only: build nothing, run nothing
  /// --probe-precisions: measure the plan's step under fp32, bf16 and fp16 (real steps, slow on
  /// a CPU); otherwise only the run's precision is measured and the others are estimated.
  bool probe_precisions = false;
  /// --world-size N: the ranks the run trains on; the plan, its breakdown and "modes" are per
  /// rank, and distributed.shard chooses its placement for them (memory/placement.h).
  int64_t world_size = 1;
};

/// With `options.estimate_only`, when the model's weights alone do not fit this device, or when
/// the smallest step exceeds it by the estimate (RunDoesNotFit) or by the probes, the
/// model is built without its weights (model/without_weights.h) and planned from the estimate
/// (memory/peak_probe.h) alone: nothing is run; the JSON has "estimate_only": true and the
/// breakdowns without and with activation checkpointing. Either way "cards" holds a
/// CardForecast (forecast/forecast.h) for every card, with its cards_to_fit and the one card
/// with offload. Both JSONs carry "world_size", "shard", "offload", "shard_reason", "host_bytes"
/// (the placement chosen for this device at that world size; "breakdown" is per rank under
/// it) and "modes": the per-rank estimate of the plan's step under every placement (shard none,
/// optimizer, gradients; with and without master weights under bf16/fp16; with and without
/// offload), each {name, shard, master_weights, offload, card_bytes, host_bytes, breakdown}.
/// Throws ConfigError for optim.offload host on a host too small.
int plan_command(const RunConfig& config, const std::string& device, int64_t memory_limit,
                 bool json, const Registry& registry, const PlanOptions& options,
                 std::ostream& out);

}  // namespace gpurun

// `gpurun plan`'s view of where the optimizer state lives: the per-rank estimate of every
// placement (memory/rank_state.h) for the JSON's "modes", the per-rank need the card forecast
// counts cards with (forecast/forecast.h, Workload::sharded), and the placement line.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "forecast/forecast.h"
#include "gpurun/config.h"
#include "memory/peak_probe.h"
#include "memory/rank_state.h"
#include "model/precision.h"
#include "train/run_setup.h"

namespace gpurun {

/// Every placement's per-rank estimate of `step` (its activations and FLOPs kept) on
/// `world_size` ranks: shard none, optimizer and gradients, each with and without master
/// weights (bf16 and fp16 only) and offload, as {name, shard, master_weights, offload,
/// card_bytes, host_bytes, breakdown}.
nlohmann::json modes_json(const RunConfig& c, const StateShape& shape, const Estimate& step,
                          Precision precision, int64_t world_size);

/// What the plan measured beyond the estimate of its own placement, added to every card's
/// lines; zero for a plan from the estimate alone.
struct LineCorrection {
  double training = 0;  ///< bytes: the measured training step's fixed part less the estimate's
  /// Bytes a sample of evaluation takes, measured; none: the checkpointed step's activations,
  /// an upper bound (evaluation keeps nothing for a backward pass).
  std::optional<double> eval_per_sample;
  double state = 0;  ///< bytes: checkpoint capture or resume loading measured, less estimated
};

/// Workload::ranks: one rank's lines on n cards of a capacity, under the placement the run
/// would take there (memory/placement.h's place_optimizer(), the host unchecked) for `c`,
/// from the estimates of micro-batch 1 without (`one`) and with (`one_ck`, none when the
/// model has no segments) activation checkpointing.
RankLinesOn rank_lines(const RunConfig& c, const StateShape& shape, const Estimate& one,
                       const std::optional<Estimate>& one_ck, Precision precision,
                       const LineCorrection& correction);

/// The rank of LoRA adapters the forecast suggests when the run holds no adapters.
inline constexpr int64_t kLoraLeverRank = 16;

/// Workload::levers and Workload::offloaded: the run with optim.master_weights (bf16, fp16),
/// with optim.offload: host, with both, and with LoRA adapters of kLoraLeverRank on every
/// Linear layer (`lora_shape`: the model's state with them; none: not suggested), each where
/// the run does not already have it.
void add_levers(Workload& w, const RunConfig& c, const StateShape& shape,
                const std::optional<StateShape>& lora_shape, const Estimate& one,
                const std::optional<Estimate>& one_ck, Precision precision,
                const LineCorrection& correction);

/// The estimates `plain` and `ck` of `micro` samples without and with activation
/// checkpointing, each for one sample; the second none where the plan may not checkpoint (a
/// model without segments, or memory.strategy accumulate or none).
std::pair<Estimate, std::optional<Estimate>> per_sample(const RunConfig& c, const Session& session,
                                                        const Estimate& plain, const Estimate& ck,
                                                        int64_t micro);

/// The smallest step a plan may choose, by `plain` and `ck` (the estimates of `micro` samples
/// without and with activation checkpointing): micro-batch 1, checkpointed where the model
/// has segments and memory.strategy allows it.
Estimate smallest_of(const RunConfig& c, const Session& session, const Estimate& plain,
                     const Estimate& ck, int64_t micro);

/// "placement       optimizer + master weights over 4 ranks (why); 12 GiB of host memory a rank"
void print_placement(std::ostream& out, const std::string& name, int64_t world_size,
                     const std::string& reason, int64_t host_bytes);

}  // namespace gpurun

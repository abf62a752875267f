// `gpurun plan`'s view of where the optimizer state lives: the per-rank estimate of every
// placement (memory/rank_state.h) for the JSON's "modes", the per-rank need the card forecast
// counts cards with (forecast/forecast.h, Workload::sharded), and the placement line.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>

#include <nlohmann/json.hpp>

#include "forecast/forecast.h"
#include "gpurun/config.h"
#include "memory/peak_probe.h"
#include "memory/rank_state.h"
#include "train/precision.h"
#include "train/run_setup.h"

namespace gpurun {

/// Every placement's per-rank estimate of `step` (its activations and FLOPs kept) on
/// `world_size` ranks: shard none, optimizer and gradients, each with and without master
/// weights (bf16 and fp16 only) and offload, as {name, shard, master_weights, offload,
/// card_bytes, host_bytes, breakdown}.
nlohmann::json modes_json(const RunConfig& c, const StateShape& shape, const Estimate& step,
                          Precision precision, int64_t world_size);

/// Workload::sharded for the forecast: on n cards the better of modes optimizer and gradients
/// (one card: the flat optimizer alone), master weights as configured, for the smallest step
/// `one` (its activations).
std::function<Workload::RankNeed(int64_t, bool)> sharded_need(const RunConfig& c, StateShape shape,
                                                              Estimate one, Precision precision);

/// The smallest step a plan may choose, by `plain` and `ck` (the estimates of `micro` samples
/// without and with activation checkpointing): micro-batch 1, checkpointed where the model
/// has segments and memory.strategy allows it.
Estimate smallest_of(const RunConfig& c, const Session& session, const Estimate& plain,
                     const Estimate& ck, int64_t micro);

/// "placement       optimizer + master weights over 4 ranks (why); 12 GiB of host memory a rank"
void print_placement(std::ostream& out, const std::string& name, int64_t world_size,
                     const std::string& reason, int64_t host_bytes);

}  // namespace gpurun

// Where a run's optimizer state lives, chosen before its probes: distributed.shard and
// optim.offload resolved against two capacities, the card's and the host's, by the per-rank
// estimate (memory/rank_state.h). Pure logic over callbacks, so that it is tested without a
// model.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "gpurun/config.h"
#include "memory/peak_probe.h"
#include "memory/rank_state.h"
#include "model/precision.h"
#include "optim/step_optimizer.h"

namespace gpurun {

/// What the choice is asked to fit.
struct PlacementRequest {
  std::string shard = "auto";    ///< distributed.shard: none | optimizer | gradients | auto
  std::string offload = "none";  ///< optim.offload: none | host | auto
  bool master_weights = false;   ///< optim.master_weights, under bf16 or fp16
  bool sixteen_bits = false;     ///< bf16 or fp16: master weights would apply
  MemoryStrategy strategy = MemoryStrategy::kAuto;  ///< only auto adds sharding and offload
  int64_t world_size = 1;
  int64_t usable_bytes = 0;  ///< the card's capacity less memory.headroom
  /// Host memory the offloaded state of this node's ranks may take (host_capacity_bytes());
  /// 0: not known, not checked.
  int64_t host_usable_bytes = 0;
  int64_t ranks_per_host = 1;  ///< ranks on this node, each with its own offloaded state
};

/// The choice and why.
struct PlacementChoice {
  OptimizerPlacement placement;
  Estimate smallest;   ///< the smallest step's estimate per rank under it
  std::string reason;  ///< "fits replicated", "replicated needs ...; optimizer fits", ...
  /// An info line for the log: distributed.shard optimizer or gradients with one rank, which
  /// has nothing to shard over; "" when none.
  std::string note;
};

/// Host bytes the offloaded state of this node's ranks needs: e.host_bytes x ranks_per_host.
int64_t host_need(const Estimate& e, const PlacementRequest& request);

/// Chooses the placement. `smallest(p)` is the estimate per rank of the smallest step a plan may
/// choose under placement p (micro-batch 1, activation checkpointing where allowed); `fits(e)`
/// says whether it fits the card (run_setup.h's exceeds_by_estimate against usable_bytes).
///  - One rank: distributed.shard optimizer or gradients has nothing to shard over: `note` says
///    so and the placement is replicated (not an error); auto is replicated.
///  - distributed.shard auto with several ranks and memory.strategy auto (sharding is its lever
///    after accumulation and checkpointing, which the probes then choose): none when the run
///    fits replicated, else optimizer, else gradients; then, with optim.offload auto, optimizer
///    and gradients with offload, where the host holds the offloaded state. When nothing fits,
///    the placement of the smallest need (the run's refusal then names it). Another strategy
///    does not shard.
///  - A fixed mode is kept; optim.offload auto adds offload only when it does not fit without.
///  - optim.master_weights is kept as configured; optim.offload host always offloads.
///  - When nothing fits, the reason names the first placement the settings do not allow that
///    would fit (offload, another shard mode, master weights under bf16/fp16), with the
///    settings that give it.
/// Throws ConfigError (exit 2) for optim.offload host when the host cannot hold the offloaded
/// state, naming the bytes per rank, the ranks, their sum and the host's usable bytes.
PlacementChoice choose_placement(const PlacementRequest& request,
                                 const std::function<Estimate(const OptimizerPlacement&)>& smallest,
                                 const std::function<bool(const Estimate&)>& fits);

/// Host memory the offloaded state of a node's ranks may take: the environment's
/// GPURUN_HOST_MEMORY when set (a SIZE: the host of another machine, or a test), else this
/// host's memory less what is not a tensor (memory/meter.h, cpu_tensor_capacity_bytes).
/// Throws ConfigError for a GPURUN_HOST_MEMORY that is not a SIZE.
int64_t host_capacity_bytes();

/// The world size a run's placement is chosen for: `world_size` when > 0, else the worker
/// environment's WORLD_SIZE (1 outside a distributed run).
int64_t placement_world_size(int64_t world_size);

/// Where the optimizer state lives (choose_placement) for `config` on a
/// card of `capacity_bytes` with `world_size` ranks (LOCAL_WORLD_SIZE of them on this host):
/// each placement's smallest step is `smallest`'s activations (micro-batch 1, checkpointed
/// where the plan may checkpoint) with that placement's per-rank state (rank_state). Throws
/// ConfigError for optim.offload host on a host too small, with the numbers.
/// `check_host` false: the host's memory is not this machine's (a forecast for a rented box)
/// and is neither checked nor refused.
PlacementChoice place_optimizer(const RunConfig& config, const StateShape& state,
                                const Estimate& smallest, Precision precision, int64_t world_size,
                                int64_t capacity_bytes, bool check_host = true);

/// True when `e` needs more than `usable_bytes` even with its activations 10% lower: the
/// estimate's activations are within a few percent of the measured ones on the built-in models
/// (scripts/bench/estimate.sh), so a step refused or left unprobed by it would not have fit.
bool exceeds_by_estimate(const Estimate& e, int64_t usable_bytes);

}  // namespace gpurun

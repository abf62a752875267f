// The memory planner: from measured probes of real training steps, choose the micro-batch,
// gradient accumulation and activation checkpointing that fit the device while keeping the
// global batch (global_batch = micro_batch x accumulation_steps x world_size).
//
// The planner itself is pure logic over a probe callback, so it is tested without a model;
// probe.h runs the real steps.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpurun {

/// One measured configuration of a training step (forward, backward, optimizer step).
struct Probe {
  int64_t micro_batch = 0;
  bool checkpointing = false;
  int64_t peak_bytes = 0;     ///< peak bytes on the device during the steps, all counted
  double step_seconds = 0;    ///< seconds of one micro-batch step (mean after the first)
  bool out_of_memory = false; ///< a step threw c10's out-of-memory error
  double seconds_per_sample() const { return micro_batch ? step_seconds / micro_batch : 0; }
};

/// The plan a run trains with; saved in every checkpoint's manifest and reused on resume
/// unless the capacity changed.
struct MemoryPlan {
  int64_t global_batch = 0;
  int64_t micro_batch = 0;
  int64_t accumulation_steps = 1;
  int64_t world_size = 1;
  int64_t eval_batch = 0;
  bool activation_checkpointing = false;
  int64_t measured_peak_bytes = 0;   ///< probe peak of this plan (0: not measured)
  int64_t estimated_peak_bytes = 0;  ///< analytic estimate of this plan
  int64_t capacity_bytes = 0;        ///< device capacity the plan was made for
  double step_seconds = 0;           ///< measured seconds per micro-batch step
  std::string reason;                ///< why this plan: "fits as configured", ...

  /// Throws ConfigError naming the numbers when global != micro x accumulation x world.
  void validate() const;
  nlohmann::json to_json() const;
  static MemoryPlan from_json(const nlohmann::json& j);
};

/// What the planner is asked to fit.
struct PlanRequest {
  int64_t global_batch = 0;
  int64_t world_size = 1;
  int64_t micro_batch = 0;     ///< the configured micro-batch (global / accumulation / world)
  int64_t eval_batch = 0;
  int64_t capacity_bytes = 0;
  double headroom = 0.1;       ///< fraction of capacity kept free
  std::string strategy = "auto";  ///< auto | accumulate | checkpoint | none
  bool can_checkpoint = true;  ///< the model has segments to checkpoint
};

using TrainProbeFn = std::function<Probe(int64_t micro_batch, bool checkpointing)>;
/// Probes evaluation at `eval_batch` in the memory state of training with `train_plan`
/// (gradients and optimizer state alive), as evaluation runs between training steps.
using EvalProbeFn = std::function<Probe(int64_t eval_batch, const MemoryPlan& train_plan)>;

/// Bytes the planner lets a plan use: capacity x (1 - headroom).
int64_t usable_bytes(const PlanRequest& request);

/// The divisors of n in decreasing order.
std::vector<int64_t> divisors_descending(int64_t n);

/// Chooses the plan: the configured micro-batch when its measured peak fits; otherwise, by
/// `strategy`, gradient accumulation (the largest micro-batch dividing global/world whose peak,
/// predicted by the line peak(b) = fixed + b x per_sample through two probes and then
/// measured, fits), activation checkpointing, or both; `auto` takes the fitting option with
/// the lowest measured seconds per sample. The eval batch is probed on its own and halved
/// until it fits (only the eval batch shrinks for an eval-only excess).
/// Throws ConfigError when nothing fits, even micro-batch 1 with checkpointing, naming the
/// need and the capacity in bytes and the smallest common card that would fit.
MemoryPlan choose_plan(const PlanRequest& request, const TrainProbeFn& train_probe,
                       const EvalProbeFn& eval_probe);

/// The next smaller micro-batch after an out-of-memory error during training: the largest
/// divisor of global/world that is at most micro/2, accumulation raised to keep the global
/// batch. Throws the ConfigError of choose_plan when micro is already 1.
MemoryPlan halve_micro_batch(const MemoryPlan& plan);

/// Common rental GPU sizes in bytes (24, 48, 80 and 141 GB cards and smaller ones).
const std::vector<std::pair<std::string, int64_t>>& common_cards();

/// "NVIDIA 24 GB (e.g. RTX 4090, L4, A10)" style name of the smallest common card with
/// usable memory >= need, or "" when none is large enough.
std::string smallest_card_for(int64_t need_bytes, double headroom);

}  // namespace gpurun

// The memory planner: from measured probes of real training steps, choose the micro-batch,
// gradient accumulation and activation checkpointing that fit the device while keeping the
// global batch (global_batch = micro_batch x accumulation_steps x world_size).
//
// The plan must hold for the whole run, so the planner fits every part of it that needs device
// memory: training steps, evaluation between them, the capture of a checkpoint and the loading
// of one on resume; the largest of their measured peaks is the plan's measured peak.
//
// The planner itself is pure logic over probe callbacks, so it is tested without a model;
// peak_probe.h runs the real code paths.
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
  int64_t peak_bytes = 0;      ///< peak bytes on the device during the steps, all counted
  double step_seconds = 0;     ///< seconds of one micro-batch step (mean after the first)
  bool out_of_memory = false;  ///< a step threw c10's out-of-memory error
  /// Not run: peak_bytes is the analytic estimate, which exceeds the usable capacity by more
  /// than its error (train/run_setup.h, exceeds_by_estimate). Such a probe never fits and gives
  /// no point to the line through measured probes.
  bool estimated = false;
  int64_t estimated_bytes = 0;  ///< the estimate of a probe that ran; 0: not estimated
  /// Evaluation: peak_bytes and step_seconds are the line through two smaller measured batches
  /// (Prober::eval), not run at this batch.
  bool predicted = false;
  bool measured() const { return !out_of_memory && !estimated; }
  double seconds_per_sample() const { return micro_batch ? step_seconds / micro_batch : 0; }
};

/// The measured peak of each part of a run, in bytes; 0: not measured (a plan saved by an
/// older gpurun, or a part an epoch did not run).
struct MeasuredPeaks {
  int64_t training = 0;            ///< optimizer steps with the plan's micro-batch
  int64_t evaluation = 0;          ///< evaluation at the plan's eval batch, between steps
  int64_t checkpoint_capture = 0;  ///< copying model, optimizer and RNG state for a checkpoint
  int64_t resume_loading = 0;      ///< loading a checkpoint into the model and a new optimizer
  /// Not a part of its own: the bytes a CPU run's checkpoint copy keeps between saves, in the
  /// device's memory during training and evaluation; 0 when the copy is released after each
  /// save (it did not fit next to them) or lives outside the device (a GPU run's pinned host
  /// buffers).
  int64_t checkpoint_buffers = 0;
  /// A CPU run's copy of the state a save takes (bytes, in the device's memory), kept between
  /// saves or not; 0 on a GPU or when not measured. Not kept (no checkpoint_buffers), it is
  /// alive while its write runs: the run writes it before training goes on
  /// (write_before_training()).
  int64_t checkpoint_copy = 0;

  /// The largest part (training and evaluation with checkpoint_buffers added): the peak of the
  /// run as a whole.
  int64_t largest() const;
  /// The name of the largest part ("training", "evaluation", "checkpoint_capture",
  /// "resume_loading"), as in to_json(); "" when nothing was measured.
  std::string largest_part() const;
  /// "training steps 35.7 MiB, evaluation 104.2 MiB (largest), ...": the measured parts in the
  /// order a run meets them, then "+ 12.0 MiB checkpoint buffers kept between saves" when
  /// there are; "" when none was measured.
  std::string to_string() const;
  /// {"training": bytes, ...}: the parts that were measured (non-zero) only, as probed (without
  /// checkpoint_buffers, which is its own key when non-zero).
  nlohmann::json to_json() const;
  /// Inverse of to_json(); a missing part reads 0.
  static MeasuredPeaks from_json(const nlohmann::json& j);
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
  int64_t measured_peak_bytes = 0;   ///< measured.largest(): the run's peak (0: not measured)
  MeasuredPeaks measured;            ///< the probe peak of each part of the run
  int64_t estimated_peak_bytes = 0;  ///< analytic estimate of this plan
  /// That estimate's parts (peak_probe.h, Estimate::to_json: parameters, gradients,
  /// optimizer_state, activations, ... in bytes); null when not estimated.
  nlohmann::json estimate;
  int64_t capacity_bytes = 0;  ///< device capacity the plan was made for
  double step_seconds = 0;     ///< measured seconds per micro-batch step
  std::string reason;          ///< why this plan: "fits as configured", ...
  /// The precision the probes ran under: fp32, bf16 or fp16 (train.precision resolved).
  std::string precision = "fp32";
  /// Where the optimizer's state lives (memory/placement.h, chosen before the probes): shard
  /// "none" (replicated on every rank), "optimizer" or "gradients" (optim/flat_optimizer.h),
  /// and offload (the state, master slice and update in host memory). A plan saved before
  /// these existed reads "none" and false.
  std::string shard = "none";
  bool offload = false;
  std::string shard_reason;  ///< why this placement: "fits replicated", ...
  int64_t host_bytes = 0;    ///< host memory a rank's offloaded state takes, by the estimate

  /// Throws ConfigError naming the numbers when global != micro x accumulation x world.
  void validate() const;
  nlohmann::json to_json() const;
  static MemoryPlan from_json(const nlohmann::json& j);
};

/// memory.strategy resolved: the levers a plan may pull when the configured micro-batch does
/// not fit (auto: all of them, sharding and offload included, memory/placement.h).
enum class MemoryStrategy { kAuto, kAccumulate, kCheckpoint, kNone };

/// memory.strategy's word as the enum: auto | accumulate | checkpoint | none. Throws ConfigError
/// for another (the schema refuses it before).
MemoryStrategy memory_strategy(const std::string& setting);
/// "auto", "accumulate", "checkpoint", "none".
const char* strategy_name(MemoryStrategy strategy);
/// Whether the strategy may choose activation checkpointing, or gradient accumulation.
inline bool may_checkpoint(MemoryStrategy s) {
  return s == MemoryStrategy::kAuto || s == MemoryStrategy::kCheckpoint;
}
inline bool may_accumulate(MemoryStrategy s) {
  return s == MemoryStrategy::kAuto || s == MemoryStrategy::kAccumulate;
}

/// What the planner is asked to fit.
struct PlanRequest {
  int64_t global_batch = 0;
  int64_t world_size = 1;
  int64_t micro_batch = 0;  ///< the configured micro-batch (global / accumulation / world)
  int64_t eval_batch = 0;
  int64_t capacity_bytes = 0;
  double headroom = 0.1;                            ///< fraction of capacity kept free
  MemoryStrategy strategy = MemoryStrategy::kAuto;  ///< memory.strategy
  bool can_checkpoint = true;                       ///< the model has segments to checkpoint
  /// The smallest rental card that holds `need_bytes` with the headroom, for the messages of a
  /// run that does not fit (forecast/cards.h, smallest_card_for over the bundled table); ""
  /// or unset: none is named.
  std::function<std::string(int64_t need_bytes)> card_for;
};

using TrainProbeFn = std::function<Probe(int64_t micro_batch, bool checkpointing)>;
/// Probes evaluation at `eval_batch` in the memory state of training with `train_plan`
/// (gradients and optimizer state alive), as evaluation runs between training steps.
using EvalProbeFn = std::function<Probe(int64_t eval_batch, const MemoryPlan& train_plan)>;

/// Checkpoint capture, in the memory state of training with a plan (as a save runs between
/// training steps), and resume loading of that checkpoint (as a resume runs before training).
struct CheckpointProbes {
  Probe capture;
  Probe resume;
  /// Bytes of the capture's copy that live in the device's memory: on the CPU the whole copy
  /// (weights, optimizer state and random state), 0 on a GPU (its copy is pinned host memory).
  int64_t copy_bytes = 0;
};
using CheckpointProbeFn = std::function<CheckpointProbes(const MemoryPlan& train_plan)>;

/// Bytes the planner lets a plan use: capacity x (1 - headroom).
int64_t usable_bytes(const PlanRequest& request);

/// The divisors of n in decreasing order.
std::vector<int64_t> divisors_descending(int64_t n);

/// Chooses the plan: the configured micro-batch when its measured peak fits; otherwise, by
/// `strategy`, gradient accumulation (the largest micro-batch dividing global/world whose peak,
/// predicted by the line peak(b) = fixed + b x per_sample through two probes and then
/// measured, fits), activation checkpointing, or both; `auto` takes the fitting option with
/// the lowest measured seconds per sample. The eval batch is probed on its own and halved
/// until it fits (only the eval batch shrinks for an eval-only excess). Checkpoint capture and
/// resume loading are probed last; no setting of the plan changes them (they hold the weights,
/// gradients and optimizer state, not activations), so they must fit as they are.
/// A CPU run keeps its checkpoint copy between saves (measured.checkpoint_buffers, so that a
/// save copies into memory that is already there, a shorter stall) when training and
/// evaluation still fit with it; otherwise the copy is released after each save, and the plan
/// says so in the log.
/// measured_peak_bytes is the largest of the four parts, which `measured` holds.
/// Throws ConfigError when nothing fits, even micro-batch 1 with checkpointing, naming the
/// need and the capacity in bytes and the smallest card that would fit (request.card_for); and when
/// checkpoint capture or resume loading does not fit, saying that the micro-batch cannot help
/// and what can.
MemoryPlan choose_plan(const PlanRequest& request, const TrainProbeFn& train_probe,
                       const EvalProbeFn& eval_probe, const CheckpointProbeFn& checkpoint_probe);

/// The next smaller micro-batch after an out-of-memory error during training: the largest
/// divisor of global/world that is at most micro/2, accumulation raised to keep the global
/// batch; the training part of `measured` is unknown again (0), and the checkpoint buffers are
/// no longer kept between saves (measured.checkpoint_buffers 0: they may be what ran out). Throws
/// the ConfigError of choose_plan when micro is already 1.
MemoryPlan halve_micro_batch(const MemoryPlan& plan);

/// Whether the run's saves must be written before training goes on: a CPU run whose copy of
/// the state is not kept between saves, because it did not fit beside training and evaluation
/// (or ran out of memory with them); training beside its background write would hold both.
bool write_before_training(const MemoryPlan& plan);

}  // namespace gpurun

// Real probes for the memory planner, measured by a MemoryMeter: a few training steps (forward,
// backward, optimizer step with its state allocated), an evaluation pass, a checkpoint capture
// and the loading of that checkpoint, each through the code the run itself calls (the trainer's
// micro-batch step and evaluation, checkpoint/train_state's capture_state and restore_state).
// They leave no trace on the run: weights, buffers and the global RNG are put back afterwards,
// gradients dropped, and each probe uses its own optimizer, so model_digest and the data order
// are as if it never ran.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

#include "gpurun/activations.h"
#include "gpurun/config.h"
#include "gpurun/dataset.h"
#include "gpurun/loss.h"
#include "memory/planner.h"
#include "model/precision.h"
#include "optim/step_optimizer.h"

namespace gpurun {

class MemoryMeter;
class SegmentedModel;

/// The analytic estimate of a training step's peak, in bytes, printed beside the measurement.
///   parameters + buffers   the model's tensors
///   gradients              one per parameter (same size)
///   optimizer_state        SGD with momentum: 1 x parameters; Adam, AdamW: 2 x (exp_avg and
///                          exp_avg_sq, PyTorch's torch.optim.Adam); plain SGD: 0
///   activations            what autograd keeps for backward of `micro_batch` samples, in
///                          the dtypes autocast gives under the precision: the model's
///                          SegmentedModel::activation_estimate() where it has one, else each
///                          layer's saved tensors by its kind (the input of a Linear or Conv,
///                          the output of a ReLU, ...); with activation checkpointing only the
///                          segment inputs plus the largest segment's saved tensors (Chen et
///                          al. 2016, "Training Deep Nets with Sublinear Memory Cost"); plus
///                          the largest tensor alive in a backward pass beside them
///                          (SegmentActivations::largest_bytes)
///   weight_casts           bf16 / fp16: autocast's cached low-precision copy of every
///                          trainable weight matrix (2 bytes per element); fp32: 0
/// Gradients and optimizer state count trainable parameters only (model.freeze, LoRA).
///   optimizer_temporaries  what the optimizer step allocates beside its state, after the
///                          activations are freed: Adam, AdamW 2 x the largest trainable
///                          parameter (sqrt(v) and its quotient, torch::optim::Adam::step);
///                          SGD with weight decay 1 x; else 0
/// The sharded optimizer's parts (memory/rank_state.h, per rank):
///   gradient_slice         its fp32 gradient slice and all-gather send buffer, alive from the
///                          reduce-scatter to the all-gather only; 0 replicated
///   gradients_released     distributed.shard gradients: the gradient buffer is released
///                          before the update, so it is not alive beside the temporaries
///   host_bytes             optim.offload host: state in host memory, not counted in total()
/// total = parameters + optimizer_state + the larger of gradients + activations + weight_casts
/// (the forward and backward pass) and the gradients still alive + gradient_slice +
/// optimizer_temporaries (the step, after autocast's cache is cleared).
struct Estimate {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0, activations = 0, weight_casts = 0,
          optimizer_temporaries = 0, gradient_slice = 0, host_bytes = 0;
  bool gradients_released = false;
  /// Not memory: the forward pass's FLOPs for one sample (SegmentActivations::forward_flops).
  double forward_flops_per_sample = 0;
  int64_t total() const {
    return parameters + optimizer_state +
           std::max(gradients + activations + weight_casts,
                    (gradients_released ? 0 : gradients) + gradient_slice + optimizer_temporaries);
  }
  /// The state parts of `state` (per rank, rank_state.h) with this estimate's activations and
  /// FLOPs.
  Estimate with_state(const Estimate& state) const;
  nlohmann::json to_json() const;
  /// Inverse of to_json(); a missing part reads 0.
  static Estimate from_json(const nlohmann::json& j);
  /// `*this` being the estimate of micro-batch 1: the same with the activations of
  /// `micro_batch` samples (they are linear in the micro-batch; the rest does not change).
  Estimate at_micro_batch(int64_t micro_batch) const;
};

/// The parts of the Estimate that no micro-batch changes (parameters, gradients, optimizer
/// state, weight casts, optimizer temporaries), read from the parameters alone, so that a model
/// built WithoutWeights (model/without_weights.h) can be estimated; activations 0.
Estimate estimate_state(SegmentedModel& model, const OptimConfig& optim, Precision precision);

/// The activation bytes of one sample of `segments` (see Estimate::activations).
int64_t activation_bytes(const std::vector<SegmentActivations>& segments, bool checkpointing);

/// Computes the Estimate; without the model's activation_estimate() it runs each layer once on
/// one sample under NoGradGuard to learn the sizes; `input_shape` is one sample's shape, e.g.
/// {1, 28, 28}.
Estimate estimate_peak(SegmentedModel& model, const OptimConfig& optim,
                       const std::vector<int64_t>& input_shape, int64_t micro_batch,
                       bool checkpointing, c10::Device device,
                       Precision precision = Precision::kFp32);

class Prober {
 public:
  /// `meter` must have been installed before `model` was built, so that its parameters count.
  /// `loss`: the run's training loss (train.loss, Session::loss), which training and
  /// evaluation call as the run does.
  /// `precision`: the run's; its steps and evaluations run under it as the trainer's do.
  Prober(SegmentedModel& model, const DatasetSplits& data, const OptimConfig& optim,
         MemoryMeter& meter, int64_t steps, c10::Device device, LossFn loss,
         Precision precision = Precision::kFp32);

  /// `steps` training steps at `micro_batch` (samples 0.. of the training split), with or
  /// without activation checkpointing. A c10::OutOfMemoryError is caught and reported as
  /// out_of_memory; memory is back at its baseline afterwards either way.
  Probe train(int64_t micro_batch, bool checkpointing);

  /// Evaluation of `eval_batch` samples as the trainer evaluates (evaluate_in_batches) in the
  /// memory state between two training steps (between_steps()), measured from that state.
  /// A batch more than 4 times the training micro-batch is first probed at the micro-batch m
  /// and at 2m; where the full probe would take longer than kEvalProbeSeconds by their
  /// time per sample (a 25.6 M gpt's eval batch of 256 contexts of 512 took 100 s on 2 cores),
  /// its peak is predicted instead (`predicted`): a forward pass under no_grad keeps one layer's
  /// activations at a time, so its peak is a line in the batch, fixed + b x per_sample; the
  /// per-sample slope is taken 10% steeper as a margin.
  Probe eval(int64_t eval_batch, const MemoryPlan& train_plan);

  /// The longest an evaluation probe may take before its peak is predicted from two smaller
  /// ones instead (seconds).
  static constexpr double kEvalProbeSeconds = 10;

  /// In the memory state between two training steps (between_steps()), capture_state() of the
  /// model and optimizer as a save does (`capture`); then, with the gradients and that optimizer
  /// gone, restore_state() of the captured checkpoint into the model and a new optimizer, as a
  /// resume does before training (`resume`). Each is measured on its own; step_seconds is its
  /// duration. An out-of-memory error marks the part it happened in (and `resume` when the
  /// capture failed, as there is nothing to load).
  CheckpointProbes checkpoint(const MemoryPlan& train_plan);

  /// The optimizer placement the probes run under (memory/placement.h's choice): a flat one
  /// probes as rank 0 of `world_size` without collectives (FlatOptimizer with no comm): its
  /// slice's state, its buffers, its copy of its own slice for the reduce-scatter. Default:
  /// replicated.
  void set_placement(const OptimizerPlacement& placement, int64_t world_size);

 private:
  /// The run's optimizer over the model's trainable parameters, under the placement.
  std::unique_ptr<StepOptimizer> make_optimizer() const;
  /// One optimizer step as the trainer does it (zero_grad, micro-batches of `micro_batch`
  /// over `indices`, gradient clipping when configured, step).
  void step(StepOptimizer& optimizer, const at::Tensor& indices, int64_t micro_batch);
  /// A new optimizer with its state and every trainable parameter's gradient allocated (zero
  /// gradients, one optimizer step), with `plan`'s checkpointing set: the memory state between
  /// two of the run's steps, without the cost of running one.
  std::unique_ptr<StepOptimizer> between_steps(const MemoryPlan& plan);
  /// Allocates `optimizer`'s state and every trainable parameter's gradient: zero gradients,
  /// one update (which changes the weights only by weight decay; the probe's Restorer puts
  /// them back).
  void allocate_state(StepOptimizer& optimizer);
  /// One evaluation probe of `eval_batch` samples, measured.
  Probe eval_once(int64_t eval_batch, const MemoryPlan& train_plan);

  SegmentedModel& model_;
  const DatasetSplits& data_;
  const OptimConfig& optim_;
  MemoryMeter& meter_;
  int64_t steps_;
  c10::Device device_;
  LossFn loss_;
  Precision precision_;
  OptimizerPlacement placement_;
  int64_t world_size_ = 1;
};

}  // namespace gpurun

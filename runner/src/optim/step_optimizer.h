// What the trainer calls for one optimizer step, whatever holds the optimizer's state: every
// rank all of it (replicated, DDP) or each rank its slice (sharded, flat_optimizer.h). The
// trainer's step is the same calls in the same order either way:
//
//   zero_grad(); [backward passes]; reduce_gradients(control); [unscale(scaler)];
//   [clip_grad_norm(max)]; step(lr, scaler)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "gpurun/config.h"
#include "model/precision.h"
#include "optim/grad_scaler.h"

namespace torch::optim {
class Optimizer;
}

namespace gpurun {

class FlatOptimizer;
class GradScaler;
class StepCollectives;

class StepOptimizer {
 public:
  virtual ~StepOptimizer() = default;

  /// Before a step's first backward: gradients zeroed (or released, replicated), so that the
  /// backward passes accumulate from zero.
  virtual void zero_grad() = 0;
  /// Frees every gradient (after an out-of-memory error); the next zero_grad() or
  /// reduce_gradients() brings them back.
  virtual void release_gradients() = 0;
  /// After the step's last backward: sums the gradients over the ranks (replicated: into
  /// every rank's .grad; sharded: into this rank's slice only), and sums `control` (flags and
  /// loss sums every rank must agree on) over the ranks with them. One process: nothing moves.
  virtual void reduce_gradients(std::vector<double>& control) = 0;
  /// fp16: divides the reduced gradients by the loss scale and records whether any is inf or
  /// NaN, on every rank alike (GradScaler::unscale).
  virtual void unscale(GradScaler& scaler) = 0;
  /// Scales the reduced gradients so that their global L2 norm is at most `max_norm`; returns
  /// the norm before clipping (as PyTorch's clip_grad_norm_).
  virtual double clip_grad_norm(double max_norm) = 0;
  /// The update at learning rate `lr`. With `scaler`, skipped when unscale() found an inf or
  /// NaN (then false); the caller calls scaler->update() after.
  virtual bool step(double lr, GradScaler* scaler) = 0;

  /// The LibTorch optimizer of a replicated run (its state is checkpointed as optim.pt);
  /// nullptr for a flat one.
  virtual torch::optim::Optimizer* replicated() { return nullptr; }
  /// The flat optimizer of a sharded run; nullptr for a replicated one.
  virtual FlatOptimizer* flat() { return nullptr; }
};

/// How a run holds its optimizer, from distributed.shard, optim.master_weights and
/// optim.offload, resolved.
struct OptimizerPlacement {
  /// "none" (replicated: LibTorch's optimizer), "optimizer" or "gradients" (flat_optimizer.h).
  std::string shard = "none";
  bool master_weights = false;  ///< 16-bit weights, fp32 master copy in the optimizer
  bool offload = false;         ///< state, master weights and step in host memory
  bool flat() const { return shard != "none" || master_weights || offload; }
};

/// The placement of a run of `world_size` ranks training in `precision`: `shard` and
/// `offload` as the memory plan chose them (memory/placement.h: distributed.shard auto
/// resolved, one rank never sharded), master weights from optim.master_weights under a 16-bit
/// precision only. Logs what it chose, and why master weights do nothing in fp32.
OptimizerPlacement resolve_placement(const RunConfig& config, const std::string& shard,
                                     bool offload, int world_size, Precision precision);

/// The 16-bit dtype of master-weight runs: fp16 for fp16, else bf16.
c10::ScalarType half_dtype(Precision precision);

/// Whether fp32 master weights apply: optim.master_weights under bf16 or fp16 (in fp32 the
/// weights are their own master).
bool uses_master_weights(const RunConfig& config, Precision precision);

/// The dtype the model's floating-point parameters and buffers are held in when it is not the
/// one they were built in: half_dtype() with master weights, else none.
std::optional<c10::ScalarType> held_dtype(const RunConfig& config, Precision precision);

/// `params`: the model's trainable parameters by name, in trainable_parameters()' order.
/// A replicated placement gives LibTorch's optimizer (optim/torch_optimizer.h) with `comm`'s
/// all-reduce; a flat one gives FlatOptimizer over `comm` (nullptr: one process), whose
/// 16-bit dtype (master weights) is `half`. Throws ConfigError for parameters of mixed dtypes
/// or devices under a flat placement.
std::unique_ptr<StepOptimizer> make_step_optimizer(
    const OptimConfig& optim, const OptimizerPlacement& placement,
    const std::vector<std::pair<std::string, at::Tensor>>& params, StepCollectives* comm,
    c10::ScalarType half = c10::ScalarType::BFloat16);

}  // namespace gpurun

// The state of a training step on one rank, in bytes, for every way a run can hold its
// optimizer (optim/step_optimizer.h's OptimizerPlacement): replicated (LibTorch's optimizer,
// DDP), or the flat sharded optimizer (optim/flat_optimizer.h) in mode optimizer or gradients,
// with fp32 master weights and with the state offloaded to host memory. Pure arithmetic over
// the parameters' shapes, so that a model built WithoutWeights is estimated, and the formulas
// are tested without a model.
//
// Replicated, with Psi trainable elements (what memory/peak_probe.h's estimate_state counts):
//   weights 4 Psi, gradients 4 Psi, Adam's moments 8 Psi (SGD with momentum 4 Psi), and under
//   bf16/fp16 autocast's 16-bit copy of each trainable weight matrix during forward/backward.
// Flat, P the padded element count (optim/flat_layout.h: each parameter aligned to 64
// elements, the whole padded to a multiple of N x 64), S = P / N, w the weights' bytes (2 with
// master weights under bf16/fp16, else 4), per flat_optimizer.h's header:
//   parameter buffer wP (and the buffers and frozen parameters, in 16 bits with master
//   weights, as the run holds them); gradient buffer wP, alive through every backward pass of a
//   step (a local full accumulation) and, in mode gradients, released before the update; fp32
//   gradient slice 4S (one process with fp32 gradients: the gradient buffer itself); Adam's
//   moments 8S (SGD with momentum 4S); fp32 master slice 4S (master weights or offload);
//   offload: the moments, the master slice and a 4S gradient copy in host memory instead; the
//   collectives' buckets (at most FlatLayout::kBucketBytes of fp32) as temporaries.
// A flat placement with distributed.shard none (master weights or offload alone) still cuts
// its state over the ranks of the process group, as mode optimizer does.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gpurun/config.h"
#include "memory/peak_probe.h"
#include "model/precision.h"
#include "optim/step_optimizer.h"

namespace gpurun {

/// What the per-rank arithmetic needs to know of a model: its parameters' shapes, read from
/// the model alone (state_shape() in peak_probe.h).
struct StateShape {
  /// Name and shape of each trainable parameter, in trainable_parameters()' order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> trainable;
  int64_t trainable_element_bytes = 4;  ///< bytes of an element as built (fp32: 4)
  int64_t other_bytes = 0;              ///< buffers and frozen parameters, as built
  /// Of other_bytes, the floating-point ones and their element count: with master weights
  /// the model is held in 16 bits (optim/step_optimizer.h's held_dtype()), these included.
  int64_t other_float_bytes = 0, other_float_numel = 0;
  int64_t numel() const;          ///< trainable elements, without padding
  int64_t matrix_numel() const;   ///< trainable elements of tensors of 2 or more dims
  int64_t largest_numel() const;  ///< elements of the largest trainable parameter
};

class SegmentedModel;

/// `model`'s StateShape, read from its parameters and buffers alone (a model built
/// WithoutWeights will do).
StateShape state_shape(SegmentedModel& model);

/// The state parts (Estimate without activations) of one rank of `world_size` under
/// `placement`, for `optim` and `precision`:
///   parameters             weights (parameter buffer) + buffers and frozen parameters
///   gradients              the gradient buffer; gradients_released: not alive at the update
///   gradient_slice         flat: the fp32 gradient slice 4S (none with one process and fp32
///                          gradients: it is the gradient buffer)
///   optimizer_state        on the card: moments or momentum, and the master slice
///   host_bytes             offload: the moments, the master slice and the gradient copy
///   weight_casts           autocast's 16-bit copies of fp32 weight matrices (bf16, fp16)
///   optimizer_temporaries  replicated: estimate_state()'s; flat over several ranks: the
///                          reduce-scatter's fp32 bucket 4 N C and the ring's two chunks 8 C
///                          bytes (C = min(FlatLayout::bucket_columns(), S)), or the
///                          all-gather's send buffer wC and, with more than one bucket, its
///                          gathered rows N w C, less the slice freed before it; with
///                          optim.grad_clip at least clip_grad_norm()'s float64 copy of one
///                          chunk of the slice, 8 min(S, FlatLayout::kClipChunkElements)
/// master weights apply under bf16 and fp16 only. Replicated, the result equals
/// estimate_state(). Throws std::invalid_argument for world_size < 1.
Estimate rank_state(const StateShape& shape, const OptimConfig& optim, Precision precision,
                    const OptimizerPlacement& placement, int64_t world_size);

/// "replicated", "optimizer", "gradients", with " + master weights" and " + offload" as they
/// apply: the placement in words for the log and the plan's JSON.
std::string placement_name(const OptimizerPlacement& placement);

}  // namespace gpurun

// Activation checkpointing of one segment (Chen et al. 2016, "Training Deep Nets with Sublinear
// Memory Cost"): the forward pass keeps only the segment's input; the backward pass runs the
// segment again with grad enabled and backpropagates through that recomputation.
#pragma once

#include <functional>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

namespace gpurun {

class SegmentedModel;

/// Returns segment->forward(x), computed without keeping the segment's intermediate
/// activations: only `x` (and the RNG states) are saved for backward. The result requires
/// grad when `x` or a parameter of the segment does; its gradient flows to `x` and into the
/// parameters' .grad exactly as without checkpointing: the parameters are inputs of the
/// autograd node, so AccumulateGrad (and any hook on it, e.g. DDP's) runs as usual.
///
/// Same numbers as an uncheckpointed forward and backward, bit for bit:
///  - RNG: the CPU generator's state, and that of x's device when it is not the CPU, is
///    saved before the forward; the recomputation runs from the saved state, and afterwards
///    the generators are put back to where they were before the recomputation, so dropout
///    masks are the same and the overall random stream is that of a run without
///    checkpointing (PyTorch's torch.utils.checkpoint with preserve_rng_state=True).
///  - Autocast: the recomputation runs under the autocast state (enabled, dtype) of the
///    forward pass on x's device type, as torch.utils.checkpoint does.
///  - Buffers: every buffer of the segment is saved before the recomputation and written
///    back after it, so BatchNorm's running statistics and num_batches_tracked are updated
///    once per forward, not twice.
///
/// `x`: any shape the segment accepts. The autograd node holds a handle to `segment` until
/// the graph is freed. The segment's parameters must not be modified in place between
/// forward and backward (the backward pass then throws, as autograd does for any saved
/// tensor), nor its structure changed. Meant for training mode with grad enabled; under
/// NoGradGuard it simply runs the segment.
///
/// `prologue`, when set, runs right before every run of the segment, the recomputation
/// included, after the RNG state is saved or restored (SegmentedModel::set_segment_prologue).
torch::Tensor checkpointed_forward(torch::nn::Sequential segment, const torch::Tensor& x,
                                   const std::function<void()>& prologue = {});

/// Turns activation checkpointing on for every segment of `model` (`on`) or off for all, the
/// two settings the memory planner chooses between (MemoryPlan::activation_checkpointing).
/// A model without segments stays without checkpointing.
void checkpoint_every_segment(SegmentedModel& model, bool on);

}  // namespace gpurun

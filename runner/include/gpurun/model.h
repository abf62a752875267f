// The model interface gpurun trains: an ordered list of segments.
//
// A model is a torch::nn::Module whose forward pass is the composition of its segments,
// x -> segment_0 -> segment_1 -> ... -> logits. Segments are the units of activation
// checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"): a
// checkpointed segment keeps only its input during the forward pass and recomputes its
// activations in the backward pass. Built-in models and plugins build their layers into
// segments with add_segment().
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include "gpurun/activations.h"

namespace gpurun {

class SegmentedModel : public torch::nn::Module {
 public:
  /// Input: a batch [N, ...] (float32 features, or int64 token ids); output: logits
  /// [N, classes], or [N, T, classes] for one prediction per position (loss.h). Runs the
  /// segments in order. A subclass may override it for a model that is not a chain of
  /// segments (the TorchScript adapter, torchscript.h); such a model has no segments, so the
  /// planner never chooses activation checkpointing for it.
  virtual torch::Tensor forward(torch::Tensor x);

  /// Appends a segment (registered as submodule `name`); returns it.
  torch::nn::Sequential add_segment(const std::string& name, torch::nn::Sequential segment);

  /// Appends a segment whose modules the model has registered itself, under names of its own
  /// (a Hugging Face model's `model.layers.0.self_attn.q_proj`): the segment only says what
  /// runs in which order, and is not a submodule, so every parameter keeps its one name in
  /// state_dict() and parameters(). A parameter two segments use (tied embeddings) must be
  /// a parameter of each segment's modules, so that a checkpointed segment passes its
  /// gradient on. Returns the segment.
  torch::nn::Sequential add_segment_over(const std::string& name, torch::nn::Sequential segment);

  const std::vector<torch::nn::Sequential>& segments() const { return segments_; }
  const std::vector<std::string>& segment_names() const { return names_; }

  /// Chooses the segments that forward() runs with activation checkpointing (see
  /// activation_checkpoint.h): flags[i] for segment i. Empty turns checkpointing off.
  /// Checkpointing applies only in training mode with grad enabled; in eval mode or under
  /// NoGradGuard every segment runs plainly. Outputs, gradients, the RNG stream and BatchNorm
  /// statistics are the same either way (bit-identical on CPU; on CUDA as far as the kernels
  /// are deterministic); only the peak memory differs.
  /// Segments added later are not checkpointed. Throws std::invalid_argument when `flags`
  /// is neither empty nor one flag per segment, naming both sizes.
  void set_checkpointed(std::vector<bool> flags);

  /// The flags of set_checkpointed(): empty, or one per segment.
  const std::vector<bool>& checkpointed() const { return checkpointed_; }

  /// Sets a function that forward() calls right before segment `index` runs, inside its
  /// activation checkpointing: a checkpointed segment's recomputation calls it again, under the
  /// same RNG state, so that what it derives from parameters (LoRA's adapted weights,
  /// model/fine_tune.h) joins the recomputed graph. Replaces any earlier one; empty: none.
  /// Throws std::out_of_range for an index past the segments.
  void set_segment_prologue(size_t index, std::function<void()> prologue);

  /// A model that knows what its segments keep for backward (attention scores inside a
  /// transformer block, the tensors of a residual block) sets a function that says so, from
  /// its shapes alone; the memory estimate (memory/peak_probe.h) then uses it instead of
  /// running each segment's layers once, so that a model built without its weights
  /// (`gpurun plan --estimate-only`) is estimated too. Empty: none.
  void set_activation_estimate(ActivationEstimate estimate) {
    activation_estimate_ = std::move(estimate);
  }
  const ActivationEstimate& activation_estimate() const { return activation_estimate_; }

 private:
  std::vector<torch::nn::Sequential> segments_;
  std::vector<std::string> names_;
  std::vector<bool> checkpointed_;
  std::vector<std::function<void()>> prologues_;  ///< one per segment, or empty
  ActivationEstimate activation_estimate_;
};

/// The tensors of `model`'s state_dict in PyTorch's order (each module's own parameters,
/// then its own buffers, then its children's, depth first), with dotted names.
std::vector<std::pair<std::string, torch::Tensor>> state_dict(const torch::nn::Module& model);

/// xxh3-64 (16 hex digits) over the raw bytes of every tensor of state_dict(model), in
/// order: equal digests mean bit-identical weights (docs/architecture.md, "Manifest").
std::string model_digest(const torch::nn::Module& model);

}  // namespace gpurun

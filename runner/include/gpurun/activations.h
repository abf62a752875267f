// What a model's segments keep for their backward pass, as a model describes it from its
// shapes alone (SegmentedModel::set_activation_estimate, model.h), for the memory estimate.
// A light header: no LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace gpurun {

/// What a training step's tensors weigh, per element, for an activation estimate.
struct ActivationDtypes {
  /// Bytes of the inputs and outputs of matrix products and convolutions: 4 (fp32), or 2
  /// under bf16 / fp16 autocast, which casts them.
  int64_t compute = 4;
  /// CUDA: autocast runs softmax in fp32, and dropout keeps a 1-byte mask (the fused kernel);
  /// on a CPU dropout keeps a mask of its input's dtype and softmax runs in `compute`.
  bool cuda = false;
  /// Bytes of an element of the model's weights, and of what adds into them outside autocast's
  /// casts (a transformer's residual stream, its normalisations' inputs): 4, or 2 when the run
  /// holds the model in 16 bits (optim.master_weights).
  int64_t weights = 4;
  /// Bytes a dropout of `p` keeps per element of an input of `input_bytes` per element.
  int64_t dropout_mask(double p, int64_t input_bytes) const {
    return p > 0 ? (cuda ? 1 : input_bytes) : 0;
  }
};

/// What autograd keeps of one segment for its backward pass, in bytes per sample.
struct SegmentActivations {
  /// The segment's input: what a checkpointed segment keeps instead of the rest.
  int64_t input_bytes = 0;
  /// The tensors its backward needs (the inputs of its products, masks, normalisation
  /// inputs, ...), created inside the segment; a tensor that two segments keep counts once.
  int64_t saved_bytes = 0;
  /// The largest tensor alive during its backward pass (a gradient of its largest
  /// activation), on top of what is saved.
  int64_t largest_bytes = 0;
  /// Floating-point operations of its forward pass (a multiply-add is 2), for the step time
  /// `gpurun plan` predicts on other cards; 0: not counted.
  double forward_flops = 0;
};

/// The activations of every segment, one entry per segment in order, for one sample.
using ActivationEstimate = std::function<std::vector<SegmentActivations>(const ActivationDtypes&)>;

}  // namespace gpurun

// Losses and accuracy for classification outputs of any rank: [N, C] logits with [N] targets
// (one class per sample), or [N, T, C] logits with [N, T] targets (one class per position, as
// in language modelling). Selected by name with train.loss; plugins add their own through
// Registry::add_loss.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>

namespace gpurun {

/// A target that counts in no loss and no accuracy (a prompt token of supervised fine-tuning,
/// data.mask_path): PyTorch's ignore_index default, transformers' label of -100.
inline constexpr int64_t kIgnoredTarget = -100;

/// A training loss: logits [N, ..., C] float, targets [N, ...] int64 with values in [0, C)
/// or kIgnoredTarget.
/// Returns a scalar: the mean over every sample (and position), so that a micro-batch's
/// loss weighted by its share of the window sums to the window's mean (step.h).
using LossFn = std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& targets)>;

/// Mean cross-entropy over every position whose target is not kIgnoredTarget: the leading
/// dimensions of `logits` [N, ..., C] and `targets` [N, ...] are flattened to [M, C] and [M]
/// before at::cross_entropy_loss (PyTorch's torch.nn.functional.cross_entropy with reduction
/// "mean" and ignore_index -100; NaN when no target counts). Throws c10::Error when the shapes
/// disagree, naming both.
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets);

/// Number of positions whose arg-max over the last dimension of `logits` [N, ..., C] equals
/// `targets` [N, ...]. Accuracy is this over counted_targets().
int64_t correct_predictions(const at::Tensor& logits, const at::Tensor& targets);

/// Number of targets that are not kIgnoredTarget.
int64_t counted_targets(const at::Tensor& targets);

}  // namespace gpurun

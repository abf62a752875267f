// One optimizer step's forward and backward passes, split into micro-batches; and evaluation in
// batches. The trainer and the memory probes run these same functions, so that what the probes
// measure is what the run does.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "gpurun/dataset.h"
#include "gpurun/errors.h"
#include "gpurun/loss.h"
#include "model/precision.h"

namespace gpurun {

class SegmentedModel;

/// The model's forward or backward pass, or the loss, failed on a batch for a reason other than
/// memory (an error of the model's own: a TorchScript module that refuses a shape, a plugin's
/// bug). The message names the pass and the batch's input shape; the trainer adds the
/// optimizer step. Exit 1, like the LibTorch error it replaces.
class BatchFailed : public Error {
 public:
  using Error::Error;
};

/// Where a pass's batches come from: called with each chunk's indices (int64 [B]), in order,
/// returns those samples (the trainer's BatchLoader::next(), data/loader.h).
using FetchBatch = std::function<Batch(const at::Tensor& indices)>;

/// Accumulates into the parameters' .grad the gradient of the mean `loss` (loss.h) over the
/// step's window of W = `window` samples, of which this rank holds `indices` (int64 [S],
/// S <= W; S = W in a single process), computed in chunks of at most `micro_batch` samples.
/// Each chunk's mean loss is weighted by chunk / W, so the result, summed over the ranks,
/// equals the gradient of one pass over all W samples (up to float summation order),
/// including for a short last window and unequal shards. The caller zeroes gradients first.
/// Returns this rank's share of the window's mean loss: sum of chunk losses x chunk / W.
/// `window` <= 0 means S. The forward pass and the loss run under autocast to
/// `precision.precision`, the backward pass outside it; with `precision.loss_scale` defined
/// (fp16's GradScaler::scale()), each backward is of the weighted loss times that scale, so the
/// gradients are scaled by it (the returned loss is not). Throws BatchFailed for a model's error
/// (c10::OutOfMemoryError passes through as it is: the planner and the trainer handle it).
double accumulate_gradients(SegmentedModel& model, const Dataset& data, const at::Tensor& indices,
                            int64_t micro_batch, c10::Device device, int64_t window = 0,
                            const LossFn& loss = cross_entropy,
                            const StepPrecision& precision = {});

/// The same, each chunk's samples from `fetch` instead of data.get().
double accumulate_gradients(SegmentedModel& model, const FetchBatch& fetch,
                            const at::Tensor& indices, int64_t micro_batch, c10::Device device,
                            int64_t window = 0, const LossFn& loss = cross_entropy,
                            const StepPrecision& precision = {});

/// The sums an evaluation adds up: loss x samples, and correct predictions over every target
/// (a sample, or a token of a sequence model).
struct EvalSums {
  double loss_sum = 0;
  double correct = 0;
  double positions = 0;
  /// Targets that count (not kIgnoredTarget), and each batch's mean loss x its counted targets:
  /// with a loss mask, the evaluation's loss is the mean over every counted target.
  double counted = 0;
  double counted_loss_sum = 0;
  /// The loss: loss_sum / samples without ignored targets, else counted_loss_sum / counted.
  double loss(int64_t samples) const;
  /// correct / counted (every target counts without a mask).
  double accuracy() const { return counted > 0 ? correct / counted : 0.0; }
};

/// Evaluates the samples `indices` (int64) of `data` in batches of at most `eval_batch`, in
/// eval mode without gradients, and puts `model` back in training mode. `before_batch`, when
/// set, is called before each batch (the trainer's heartbeat). The forward passes run under
/// autocast to `precision`, as training's do. Throws BatchFailed as accumulate_gradients().
EvalSums evaluate_in_batches(SegmentedModel& model, const Dataset& data, const at::Tensor& indices,
                             int64_t eval_batch, c10::Device device, const LossFn& loss,
                             const std::function<void()>& before_batch = {},
                             Precision precision = Precision::kFp32);

/// The same, each batch's samples from `fetch` instead of data.get().
EvalSums evaluate_in_batches(SegmentedModel& model, const FetchBatch& fetch,
                             const at::Tensor& indices, int64_t eval_batch, c10::Device device,
                             const LossFn& loss, const std::function<void()>& before_batch = {},
                             Precision precision = Precision::kFp32);

}  // namespace gpurun

#include "train/micro_batch_step.h"

#include <algorithm>

#include <torch/csrc/autograd/grad_mode.h>

#include "gpurun/dataset.h"
#include "gpurun/model.h"

namespace gpurun {

double accumulate_gradients(SegmentedModel& model, const Dataset& data, const at::Tensor& indices,
                            int64_t micro_batch, c10::Device device, int64_t window,
                            const LossFn& loss_fn, const StepPrecision& precision) {
  const int64_t shard = indices.numel();
  if (window <= 0) window = shard;
  double loss_sum = 0;
  for (int64_t start = 0; start < shard; start += micro_batch) {
    const int64_t count = std::min(micro_batch, shard - start);
    Batch batch = data.get(indices.narrow(0, start, count));
    at::Tensor loss;
    {
      AutocastGuard autocast(precision.precision, device);
      at::Tensor logits = model.forward(batch.inputs.to(device));
      loss = loss_fn(logits, batch.targets.to(device));
    }
    at::Tensor weighted = loss * (static_cast<double>(count) / window);
    if (precision.loss_scale.defined()) weighted = weighted * precision.loss_scale;
    weighted.backward();
    loss_sum += loss.item<double>() * count;
  }
  return window ? loss_sum / window : 0.0;
}

EvalSums evaluate_in_batches(SegmentedModel& model, const Dataset& data, const at::Tensor& indices,
                             int64_t eval_batch, c10::Device device, const LossFn& loss_fn,
                             const std::function<void()>& before_batch, Precision precision) {
  model.eval();
  EvalSums sums;
  {
    torch::NoGradGuard no_grad;
    const int64_t m = indices.numel();
    for (int64_t start = 0; start < m; start += eval_batch) {
      const int64_t count = std::min(eval_batch, m - start);
      if (before_batch) before_batch();
      Batch batch = data.get(indices.narrow(0, start, count));
      AutocastGuard autocast(precision, device);
      at::Tensor logits = model.forward(batch.inputs.to(device));
      at::Tensor targets = batch.targets.to(device);
      sums.loss_sum += loss_fn(logits, targets).item<double>() * count;
      sums.correct += static_cast<double>(correct_predictions(logits, targets));
      sums.positions += static_cast<double>(targets.numel());
    }
  }
  model.train();
  return sums;
}

}  // namespace gpurun

#include "model/micro_batch_step.h"

#include <algorithm>
#include <atomic>
#include <string>

#include <spdlog/spdlog.h>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "gpurun/dataset.h"
#include "gpurun/model.h"

namespace gpurun {

namespace {

/// "[4, 1, 28, 28]".
std::string shape_text(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

/// Runs `pass` on `batch`, turning a model's own error (a c10::Error, TorchScript's
/// JITException, any std::exception) into BatchFailed naming `what` and the input's shape;
/// out-of-memory errors and gpurun's own pass through unchanged.
template <typename Pass>
auto on_batch(const char* what, const at::Tensor& inputs, Pass&& pass) {
  try {
    return pass();
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const Error&) {
    throw;  // gpurun's own (a stop, a fault hook): already says what it is
  } catch (const c10::Error& e) {
    throw BatchFailed(std::string(what) + " of a batch of shape " + shape_text(inputs) +
                      " failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    // TorchScript's interpreter throws torch::jit::JITException, a std::runtime_error.
    throw BatchFailed(std::string(what) + " of a batch of shape " + shape_text(inputs) +
                      " failed: " + e.what());
  }
}

}  // namespace

double accumulate_gradients(SegmentedModel& model, const Dataset& data, const at::Tensor& indices,
                            int64_t micro_batch, c10::Device device, int64_t window,
                            const LossFn& loss_fn, const StepPrecision& precision) {
  return accumulate_gradients(
      model, [&](const at::Tensor& chunk) { return data.get(chunk); }, indices, micro_batch, device,
      window, loss_fn, precision);
}

double accumulate_gradients(SegmentedModel& model, const FetchBatch& fetch,
                            const at::Tensor& indices, int64_t micro_batch, c10::Device device,
                            int64_t window, const LossFn& loss_fn, const StepPrecision& precision) {
  const int64_t shard = indices.numel();
  if (window <= 0) window = shard;
  double loss_sum = 0;
  for (int64_t start = 0; start < shard; start += micro_batch) {
    const int64_t count = std::min(micro_batch, shard - start);
    Batch batch = fetch(indices.narrow(0, start, count));
    const at::Tensor loss = on_batch("the forward pass and loss", batch.inputs, [&] {
      AutocastGuard autocast(precision.precision, device);
      at::Tensor logits = model.forward(batch.inputs.to(device));
      return loss_fn(logits, batch.targets.to(device));
    });
    at::Tensor weighted = loss * (static_cast<double>(count) / window);
    if (precision.loss_scale.defined()) weighted = weighted * precision.loss_scale;
    on_batch("the backward pass", batch.inputs, [&] {
      weighted.backward();
      return 0;
    });
    // A chunk whose loss mask counts no target has no mean: its loss is 0/0, its gradient 0
    // (no target reaches the backward of the loss). It adds 0 to the step's loss, said once.
    if (counted_targets(batch.targets) == 0) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true))
        spdlog::warn(
            "a micro-batch of {} samples counts no target (its loss mask is 0 throughout): it "
            "adds nothing to the gradient, and 0 to the step's logged loss (said once)",
            count);
      continue;
    }
    loss_sum += loss.item<double>() * count;
  }
  return window ? loss_sum / window : 0.0;
}

double EvalSums::loss(int64_t samples) const {
  if (counted == positions) return samples ? loss_sum / static_cast<double>(samples) : 0.0;
  return counted > 0 ? counted_loss_sum / counted : 0.0;
}

EvalSums evaluate_in_batches(SegmentedModel& model, const Dataset& data, const at::Tensor& indices,
                             int64_t eval_batch, c10::Device device, const LossFn& loss_fn,
                             const std::function<void()>& before_batch, Precision precision) {
  return evaluate_in_batches(
      model, [&](const at::Tensor& chunk) { return data.get(chunk); }, indices, eval_batch, device,
      loss_fn, before_batch, precision);
}

EvalSums evaluate_in_batches(SegmentedModel& model, const FetchBatch& fetch,
                             const at::Tensor& indices, int64_t eval_batch, c10::Device device,
                             const LossFn& loss_fn, const std::function<void()>& before_batch,
                             Precision precision) {
  model.eval();
  EvalSums sums;
  {
    torch::NoGradGuard no_grad;
    const int64_t m = indices.numel();
    for (int64_t start = 0; start < m; start += eval_batch) {
      const int64_t count = std::min(eval_batch, m - start);
      if (before_batch) before_batch();
      Batch batch = fetch(indices.narrow(0, start, count));
      AutocastGuard autocast(precision, device);
      at::Tensor logits = on_batch("evaluation's forward pass", batch.inputs,
                                   [&] { return model.forward(batch.inputs.to(device)); });
      at::Tensor targets = batch.targets.to(device);
      const double mean = loss_fn(logits, targets).item<double>();
      const auto counted = static_cast<double>(counted_targets(targets));
      sums.loss_sum += mean * count;
      if (counted > 0) sums.counted_loss_sum += mean * counted;
      sums.counted += counted;
      sums.correct += static_cast<double>(correct_predictions(logits, targets));
      sums.positions += static_cast<double>(targets.numel());
    }
  }
  model.train();
  return sums;
}

}  // namespace gpurun

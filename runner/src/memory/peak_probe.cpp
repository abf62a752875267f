#include "memory/peak_probe.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

#include "memory/meter.h"
#include "gpurun/model.h"
#include "train/optimizer.h"
#include "train/micro_batch_step.h"
#include "util/rng.h"

namespace gpurun {
namespace {

at::Tensor first_samples(int64_t count, int64_t n) {
  return at::remainder(at::arange(count, at::kLong), n);
}

/// Puts weights, buffers, the global RNG and the checkpointing flags back and drops the
/// gradients when the probe ends, so that the probe leaves no trace on the run.
class Restorer {
 public:
  explicit Restorer(SegmentedModel& model) : model_(model), flags_(model.checkpointed()) {
    for (const auto& entry : state_dict(model)) {
      saved_.push_back(entry.second.detach().clone());
      saved_bytes_ += static_cast<int64_t>(saved_.back().nbytes());
    }
    saved_bytes_ += rng_.saved_bytes();
  }
  ~Restorer() {
    {
      torch::NoGradGuard no_grad;
      auto tensors = state_dict(model_);
      for (size_t i = 0; i < tensors.size(); ++i) tensors[i].second.copy_(saved_[i]);
      for (auto& p : model_.parameters()) p.mutable_grad() = at::Tensor();
    }
    model_.set_checkpointed(flags_);
    model_.train();
  }
  /// Bytes of the copies this object holds, to subtract from the meter's readings.
  int64_t saved_bytes() const { return saved_bytes_; }

 private:
  SegmentedModel& model_;
  std::vector<bool> flags_;
  std::vector<at::Tensor> saved_;
  RngGuard rng_{default_generator(at::kCPU)};
  int64_t saved_bytes_ = 0;
};

std::vector<bool> all_segments(const SegmentedModel& model, bool on) {
  return on ? std::vector<bool>(model.segments().size(), true) : std::vector<bool>{};
}

}  // namespace

nlohmann::json Estimate::to_json() const {
  return {{"parameters", parameters},
          {"gradients", gradients},
          {"optimizer_state", optimizer_state},
          {"activations", activations},
          {"total", total()}};
}

Estimate estimate_peak(SegmentedModel& model, const OptimConfig& optim,
                       const std::vector<int64_t>& input_shape, int64_t micro_batch,
                       bool checkpointing, c10::Device device) {
  Estimate e;
  for (const auto& entry : state_dict(model)) e.parameters += entry.second.nbytes();
  for (const auto& p : model.parameters())
    if (p.requires_grad()) e.gradients += p.nbytes();
  if (optim.name == "adam" || optim.name == "adamw")
    e.optimizer_state = 2 * e.gradients;
  else if (optim.momentum > 0)
    e.optimizer_state = e.gradients;

  // Output bytes of every layer for one sample, by segment.
  std::vector<int64_t> sample_shape{1};
  sample_shape.insert(sample_shape.end(), input_shape.begin(), input_shape.end());
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();  // BatchNorm must not update its statistics; dropout keeps shapes anyway
  at::Tensor x = at::zeros(sample_shape, at::TensorOptions().device(device));
  int64_t segment_inputs = 0, largest_segment = 0, all_outputs = 0;
  for (torch::nn::Sequential segment : model.segments()) {  // a copy of the holder: non-const
    segment_inputs += static_cast<int64_t>(x.nbytes());
    int64_t inside = 0;
    for (auto& layer : *segment) {
      x = layer.forward(x);
      inside += static_cast<int64_t>(x.nbytes());
    }
    all_outputs += inside;
    largest_segment = std::max(largest_segment, inside);
  }
  if (was_training) model.train();
  e.activations = micro_batch * (checkpointing ? segment_inputs + largest_segment : all_outputs);
  return e;
}

Prober::Prober(SegmentedModel& model, const DatasetSplits& data, const OptimConfig& optim,
               MemoryMeter& meter, int64_t steps, c10::Device device, LossFn loss)
    : model_(model),
      data_(data),
      optim_(optim),
      meter_(meter),
      steps_(steps),
      device_(device),
      loss_(std::move(loss)) {}

Probe Prober::train(int64_t micro_batch, bool checkpointing) {
  Probe probe;
  probe.micro_batch = micro_batch;
  probe.checkpointing = checkpointing;
  Restorer restore(model_);
  model_.set_checkpointed(all_segments(model_, checkpointing));
  model_.train();
  const at::Tensor indices = first_samples(micro_batch, data_.train->size());
  double timed = 0;
  int64_t timed_steps = 0;
  meter_.reset_peak();
  try {
    auto optimizer = make_optimizer(optim_, model_.parameters());
    for (int64_t step = 0; step < steps_; ++step) {
      const auto start = std::chrono::steady_clock::now();
      optimizer->zero_grad();
      accumulate_gradients(model_, *data_.train, indices, micro_batch, device_, 0, loss_);
      optimizer->step();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (step > 0 || steps_ == 1) {
        timed += seconds;
        ++timed_steps;
      }
    }
  } catch (const c10::OutOfMemoryError& e) {
    probe.out_of_memory = true;
    spdlog::debug("probe micro-batch {}{}: out of memory", micro_batch,
                  checkpointing ? " (checkpointed)" : "");
  }
  probe.peak_bytes = meter_.peak_bytes() - restore.saved_bytes();
  probe.step_seconds = timed_steps ? timed / timed_steps : 0;
  spdlog::debug("probe micro-batch {}{}: peak {} bytes, {:.4f} s/step", micro_batch,
                checkpointing ? " (checkpointed)" : "", probe.peak_bytes, probe.step_seconds);
  return probe;
}

Probe Prober::eval(int64_t eval_batch, const MemoryPlan& train_plan) {
  Probe probe;
  probe.micro_batch = eval_batch;
  Restorer restore(model_);
  model_.set_checkpointed(all_segments(model_, train_plan.activation_checkpointing));
  model_.train();
  try {
    auto optimizer = make_optimizer(optim_, model_.parameters());
    optimizer->zero_grad();
    accumulate_gradients(model_, *data_.train,
                         first_samples(train_plan.micro_batch, data_.train->size()),
                         train_plan.micro_batch, device_, 0, loss_);
    optimizer->step();
    meter_.reset_peak();
    const auto start = std::chrono::steady_clock::now();
    model_.eval();
    torch::NoGradGuard no_grad;
    Batch batch = data_.eval->get(first_samples(eval_batch, data_.eval->size()));
    model_.forward(batch.inputs.to(device_));
    probe.step_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } catch (const c10::OutOfMemoryError& e) {
    probe.out_of_memory = true;
  }
  probe.peak_bytes = meter_.peak_bytes() - restore.saved_bytes();
  return probe;
}

}  // namespace gpurun

#include "memory/peak_probe.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/dropout.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>

#include <spdlog/spdlog.h>

#include "checkpoint/format/sharded_state.h"
#include "checkpoint/format/train_state.h"
#include "gpurun/model.h"
#include "memory/meter.h"
#include "memory/rank_state.h"
#include "model/activation_checkpointing.h"
#include "model/fine_tune.h"
#include "model/micro_batch_step.h"
#include "optim/flat_optimizer.h"
#include "optim/torch_optimizer.h"
#include "util/clock.h"
#include "util/rng.h"
#include "util/units.h"

namespace gpurun {
namespace {

/// The first min(count, n) samples of a split of n: a step's window is at most the epoch, and
/// an evaluation batch at most the split, so a probe never holds more than the run can (a
/// train.batch_size beyond the training set must not be probed at its configured size).
at::Tensor first_samples(int64_t count, int64_t n) {
  return at::arange(std::min(count, n), at::kLong);
}

/// Puts weights, buffers, the global RNG and the checkpointing flags back and drops the
/// gradients when the probe ends, so that the probe leaves no trace on the run.
class Restorer {
 public:
  explicit Restorer(SegmentedModel& model) : model_(model), flags_(model.checkpointed()) {
    // As host bytes that no meter counts: a copy of the weights on the device, or through the
    // counting CPU allocator, would take room under --memory-limit that the run does not use,
    // so the probes would run out of memory where the run fits.
    for (const auto& entry : state_dict(model)) {
      const at::Tensor host = entry.second.detach().to(at::kCPU).contiguous();
      saved_.emplace_back(static_cast<const char*>(host.data_ptr()), host.nbytes());
      dtypes_.push_back(entry.second.scalar_type());
    }
    saved_bytes_ += rng_.saved_bytes();
    // The device's generator too: dropout on a GPU draws from it, and a resumed run (which
    // reuses its plan and probes nothing) must see the stream an uninterrupted run saw.
    const std::vector<at::Tensor> params = model.parameters();
    if (!params.empty() && !params.front().device().is_cpu())
      device_rng_.emplace(default_generator(params.front().device()));
  }
  ~Restorer() {
    {
      torch::NoGradGuard no_grad;
      auto tensors = state_dict(model_);
      for (size_t i = 0; i < tensors.size(); ++i) {
        at::Tensor& t = tensors[i].second;
        const at::Tensor saved = at::from_blob(saved_[i].data(), t.sizes(),
                                               t.options().device(at::kCPU).dtype(dtypes_[i]));
        // A flat optimizer's probe left the parameters as views of its buffer (in 16 bits with
        // master weights): each gets a tensor of its own again, as the model built it.
        if (t.scalar_type() != dtypes_[i] || t.storage().nbytes() != t.nbytes())
          t.set_data(saved.to(t.device()).clone());
        else
          t.copy_(saved);
      }
      for (auto& p : model_.parameters()) p.mutable_grad() = at::Tensor();
    }
    model_.set_checkpointed(flags_);
    model_.train();
  }
  /// Bytes this object holds under the meter (the generator state), to subtract from its
  /// readings.
  int64_t saved_bytes() const { return saved_bytes_; }

 private:
  SegmentedModel& model_;
  std::vector<bool> flags_;
  std::vector<std::string> saved_;       ///< each state_dict tensor's bytes, contiguous
  std::vector<c10::ScalarType> dtypes_;  ///< and its dtype
  RngGuard rng_{default_generator(at::kCPU)};
  std::optional<RngGuard> device_rng_;
  int64_t saved_bytes_ = 0;
};

/// What autograd keeps of one layer of a Sequential, by the layer's kind (the tensors its
/// backward formula in PyTorch's derivatives.yaml takes), added to `kept` by storage, so that a
/// tensor kept by two layers (a ReLU's output that the next Linear takes) counts once; `kept`
/// holds the storages alive, so that no later tensor reuses a kept one's address. The bytes
/// newly kept are added to `saved`.
void keep_for_backward(const torch::nn::AnyModule& layer, const at::Tensor& in,
                       const at::Tensor& out, const ActivationDtypes& dtypes,
                       std::map<const void*, c10::Storage>& kept, int64_t& saved, double& flops) {
  const std::string kind = layer.ptr()->name();
  auto keep = [&](const at::Tensor& t) {
    if (kept.emplace(t.storage().data(), t.storage()).second)
      saved += static_cast<int64_t>(t.storage().nbytes());
  };
  auto has = [&](const char* name) { return kind.find(name) != std::string::npos; };
  if (has("Linear") || has("Conv")) {
    // A multiply-add per weight element and output position: 2 x weight / out-channels x out.
    const auto params = layer.ptr()->named_parameters(false);
    if (const auto* weight = params.find("weight"); weight && weight->dim() >= 2)
      flops += 2.0 * static_cast<double>(weight->numel() / weight->size(0)) *
               static_cast<double>(out.numel());
    // The input, as autocast cast it for the product: a new copy when its dtype changes.
    if (static_cast<int64_t>(in.element_size()) == dtypes.compute || !in.is_floating_point())
      keep(in);
    else
      saved += in.numel() * dtypes.compute;
  } else if (has("ReLU") || has("Sigmoid") || has("Tanh") || has("Softmax")) {
    keep(out);
  } else if (has("MaxPool")) {
    keep(in);
    saved += out.numel() * 8;  // the int64 indices of the maxima
  } else if (has("Dropout")) {
    const auto* d = layer.ptr()->as<torch::nn::DropoutImpl>();
    if (d && d->options.p() > 0) {
      saved += in.numel() * dtypes.dropout_mask(d->options.p(), in.element_size());
      saved += out.numel() * static_cast<int64_t>(out.element_size());  // the output it makes
    }
  } else if (has("Flatten") || has("AdaptiveAvgPool") || has("Identity")) {
    // shapes only
  } else if (has("BatchNorm") || has("LayerNorm") || has("GELU") || has("SiLU") ||
             has("Embedding")) {
    keep(in);
  } else {
    keep(in);  // an unknown layer: assume it keeps its input and its output
    keep(out);
  }
}

/// The activations of each segment, from running its layers once on one sample of zeros under
/// NoGradGuard in eval mode (BatchNorm must not update its statistics; shapes are the same).
/// largest_bytes stays 0: in a chain of layers each gradient replaces the saved tensors of the
/// layer it passed, so the backward pass never holds much beyond them (measured: the cnn's
/// peak is its saved tensors plus 4%); a model with skip connections, which keep gradients of
/// two paths at once, says so in its own activation_estimate().
std::vector<SegmentActivations> walk_segments(SegmentedModel& model,
                                              const std::vector<int64_t>& input_shape,
                                              c10::Device device, Precision precision,
                                              const ActivationDtypes& dtypes) {
  std::vector<int64_t> sample_shape{1};
  sample_shape.insert(sample_shape.end(), input_shape.begin(), input_shape.end());
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  at::Tensor x = at::zeros(sample_shape, at::TensorOptions().device(device));
  // The layers' outputs in the dtypes autocast gives them (bf16 or fp16 for matrix products).
  AutocastGuard autocast(precision, device);
  std::vector<SegmentActivations> out;
  std::map<const void*, c10::Storage> kept;  // across segments: a tensor two segments keep
  for (torch::nn::Sequential segment : model.segments()) {  // a copy of the holder: non-const
    SegmentActivations a;
    a.input_bytes = static_cast<int64_t>(x.nbytes());
    for (auto& layer : *segment) {
      at::Tensor in = x;
      x = layer.forward(x);
      keep_for_backward(layer, in, x, dtypes, kept, a.saved_bytes, a.forward_flops);
    }
    out.push_back(a);
  }
  if (was_training) model.train();
  return out;
}

}  // namespace

nlohmann::json Estimate::to_json() const {
  return {{"parameters", parameters},
          {"gradients", gradients},
          {"optimizer_state", optimizer_state},
          {"activations", activations},
          {"weight_casts", weight_casts},
          {"optimizer_temporaries", optimizer_temporaries},
          {"gradient_slice", gradient_slice},
          {"gradients_released", gradients_released},
          {"host_bytes", host_bytes},
          {"total", total()},
          {"forward_flops_per_sample", forward_flops_per_sample}};
}

Estimate Estimate::from_json(const nlohmann::json& j) {
  Estimate e;
  if (!j.is_object()) return e;
  e.parameters = j.value("parameters", int64_t{0});
  e.gradients = j.value("gradients", int64_t{0});
  e.optimizer_state = j.value("optimizer_state", int64_t{0});
  e.activations = j.value("activations", int64_t{0});
  e.weight_casts = j.value("weight_casts", int64_t{0});
  e.optimizer_temporaries = j.value("optimizer_temporaries", int64_t{0});
  e.gradient_slice = j.value("gradient_slice", int64_t{0});
  e.gradients_released = j.value("gradients_released", false);
  e.host_bytes = j.value("host_bytes", int64_t{0});
  e.forward_flops_per_sample = j.value("forward_flops_per_sample", 0.0);
  return e;
}

Estimate Estimate::with_state(const Estimate& state) const {
  Estimate e = state;
  e.activations = activations;
  e.forward_flops_per_sample = forward_flops_per_sample;
  return e;
}

Estimate Estimate::at_micro_batch(int64_t micro_batch) const {
  Estimate e = *this;
  e.activations = activations * micro_batch;
  return e;
}

int64_t activation_bytes(const std::vector<SegmentActivations>& segments, bool checkpointing) {
  int64_t inputs = 0, saved = 0, largest_saved = 0, largest = 0;
  for (const SegmentActivations& a : segments) {
    inputs += a.input_bytes;
    saved += a.saved_bytes;
    largest_saved = std::max(largest_saved, a.saved_bytes);
    largest = std::max(largest, a.largest_bytes);
  }
  // The backward pass of the segment with the largest tensor holds its gradient beside what is
  // kept.
  return (checkpointing ? inputs + largest_saved : saved) + largest;
}

Estimate estimate_state(SegmentedModel& model, const OptimConfig& optim, Precision precision) {
  return rank_state(state_shape(model), optim, precision, OptimizerPlacement{}, 1);
}

Estimate estimate_peak(SegmentedModel& model, const OptimConfig& optim,
                       const std::vector<int64_t>& input_shape, int64_t micro_batch,
                       bool checkpointing, c10::Device device, Precision precision) {
  Estimate e = estimate_state(model, optim, precision);
  const int64_t half = static_cast<int64_t>(c10::elementSize(autocast_dtype(precision)));

  int64_t weights = 4;
  for (const at::Tensor& p : model.parameters())
    if (p.is_floating_point()) {
      weights = static_cast<int64_t>(p.element_size());
      break;
    }
  const ActivationDtypes dtypes{precision == Precision::kFp32 ? 4 : half, device.is_cuda(),
                                weights};
  const std::vector<SegmentActivations> segments =
      model.activation_estimate() ? model.activation_estimate()(dtypes)
                                  : walk_segments(model, input_shape, device, precision, dtypes);
  e.activations = micro_batch * activation_bytes(segments, checkpointing);
  for (const SegmentActivations& a : segments) e.forward_flops_per_sample += a.forward_flops;
  return e;
}

Prober::Prober(SegmentedModel& model, const DatasetSplits& data, const OptimConfig& optim,
               MemoryMeter& meter, int64_t steps, c10::Device device, LossFn loss,
               Precision precision)
    : model_(model),
      data_(data),
      optim_(optim),
      meter_(meter),
      steps_(steps),
      device_(device),
      loss_(std::move(loss)),
      precision_(precision) {}

void Prober::set_placement(const OptimizerPlacement& placement, int64_t world_size) {
  placement_ = placement;
  world_size_ = world_size;
}

std::unique_ptr<StepOptimizer> Prober::make_optimizer() const {
  auto params = named_trainable_parameters(model_);
  if (!placement_.flat()) return make_step_optimizer(optim_, placement_, params, nullptr);
  FlatOptimizerOptions options;
  options.release_gradients = placement_.shard == "gradients";
  options.master_weights = placement_.master_weights;
  options.half = half_dtype(precision_);
  options.offload = placement_.offload;
  return std::make_unique<FlatOptimizer>(optim_, options, params, nullptr, 0, world_size_);
}

void Prober::step(StepOptimizer& optimizer, const at::Tensor& indices, int64_t micro_batch) {
  optimizer.zero_grad();
  // fp16 as the trainer runs it: scaled backward, unscale, clip, a step that may be skipped.
  std::optional<GradScaler> scaler;
  if (precision_ == Precision::kFp16) scaler.emplace(device_);
  accumulate_gradients(model_, *data_.train, indices, micro_batch, device_, 0, loss_,
                       {precision_, scaler ? scaler->scale() : at::Tensor()});
  std::vector<double> control;
  optimizer.reduce_gradients(control);
  if (scaler) optimizer.unscale(*scaler);
  if (optim_.grad_clip > 0) optimizer.clip_grad_norm(optim_.grad_clip);
  optimizer.step(optim_.lr, scaler ? &*scaler : nullptr);
  if (scaler) scaler->update();
}

std::unique_ptr<StepOptimizer> Prober::between_steps(const MemoryPlan& plan) {
  checkpoint_every_segment(model_, plan.activation_checkpointing);
  model_.train();
  // What lives between two of the run's steps is the weights, their gradients and the
  // optimizer's state; the activations are gone. Made without running the model (a step of a
  // large model takes a minute on a CPU): zero gradients and one update, which allocates the
  // state as the run's first step does (a flat optimizer's is there from the start, and with
  // distributed.shard gradients its full gradients are gone again after the reduce). The
  // weights it changes (weight decay) are put back by the probe's Restorer.
  auto optimizer = make_optimizer();
  allocate_state(*optimizer);
  return optimizer;
}

void Prober::allocate_state(StepOptimizer& optimizer) {
  optimizer.zero_grad();
  if (!optimizer.flat()) {
    torch::NoGradGuard no_grad;
    for (at::Tensor p : trainable_parameters(model_)) p.mutable_grad() = at::zeros_like(p);
  }
  std::vector<double> control;
  optimizer.reduce_gradients(control);
  optimizer.step(optim_.lr, nullptr);
}

Probe Prober::train(int64_t micro_batch, bool checkpointing) {
  Probe probe;
  probe.micro_batch = micro_batch;
  probe.checkpointing = checkpointing;
  Restorer restore(model_);
  checkpoint_every_segment(model_, checkpointing);
  model_.train();
  const at::Tensor indices = first_samples(micro_batch, data_.train->size());
  double timed = 0;
  int64_t timed_steps = 0;
  meter_.reset_peak();
  try {
    // The state a lazy optimizer (LibTorch's Adam) allocates at its first update is alive
    // through every later step's forward and backward: allocated before the measured steps, so
    // that a probe of one step measures a step of the run, not its first.
    auto optimizer = make_optimizer();
    allocate_state(*optimizer);
    for (int64_t i = 0; i < steps_; ++i) {
      const auto start = std::chrono::steady_clock::now();
      step(*optimizer, indices, micro_batch);
      const double seconds = seconds_since(start);
      if (i > 0 || steps_ == 1) {
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
  const int64_t small = std::max<int64_t>(1, train_plan.micro_batch);
  if (eval_batch <= 4 * small) return eval_once(eval_batch, train_plan);
  const Probe one = eval_once(small, train_plan);
  if (!one.measured()) return one;  // a larger batch runs out of memory too
  const Probe two = eval_once(2 * small, train_plan);
  if (!two.measured()) return two;
  const double seconds = two.step_seconds * static_cast<double>(eval_batch) / (2.0 * small);
  if (seconds <= kEvalProbeSeconds) return eval_once(eval_batch, train_plan);
  const double per_sample =
      1.1 * static_cast<double>(std::max<int64_t>(0, two.peak_bytes - one.peak_bytes)) /
      static_cast<double>(small);
  Probe line = two;
  line.micro_batch = eval_batch;
  line.peak_bytes = two.peak_bytes +
                    static_cast<int64_t>(per_sample * static_cast<double>(eval_batch - 2 * small));
  line.step_seconds = seconds;
  line.predicted = true;
  spdlog::info(
      "eval batch {}: peak {} predicted from eval batches {} ({}) and {} ({}), +10% a sample; "
      "probing it would take about {:.0f} s",
      eval_batch, format_bytes(line.peak_bytes), small, format_bytes(one.peak_bytes), 2 * small,
      format_bytes(two.peak_bytes), seconds);
  return line;
}

Probe Prober::eval_once(int64_t eval_batch, const MemoryPlan& train_plan) {
  Probe probe;
  probe.micro_batch = eval_batch;
  Restorer restore(model_);
  try {
    auto optimizer = between_steps(train_plan);
    meter_.reset_peak();
    const auto start = std::chrono::steady_clock::now();
    evaluate_in_batches(model_, *data_.eval, first_samples(eval_batch, data_.eval->size()),
                        eval_batch, device_, loss_, {}, precision_);
    probe.step_seconds = seconds_since(start);
  } catch (const c10::OutOfMemoryError& e) {
    probe.out_of_memory = true;
  }
  probe.peak_bytes = meter_.peak_bytes() - restore.saved_bytes();
  spdlog::debug("probe eval batch {}: peak {} bytes", eval_batch, probe.peak_bytes);
  return probe;
}

CheckpointProbes Prober::checkpoint(const MemoryPlan& train_plan) {
  CheckpointProbes probes;
  Restorer restore(model_);
  // The captured files are host bytes (std::string), which no meter counts, as in a save.
  std::optional<CheckpointSnapshot> snapshot;
  try {
    auto optimizer = between_steps(train_plan);
    meter_.reset_peak();
    const auto start = std::chrono::steady_clock::now();
    CheckpointMeta meta;
    meta.config = {{"optim", {{"name", optim_.name}}}};
    snapshot = capture_state(model_, *optimizer, std::move(meta), {}, &probes.copy_bytes);
    probes.capture.step_seconds = seconds_since(start);
    if (!device_.is_cpu()) probes.copy_bytes = 0;  // pinned host memory, not the device's
  } catch (const c10::OutOfMemoryError& e) {
    probes.capture.out_of_memory = true;
  }
  probes.capture.peak_bytes = meter_.peak_bytes() - restore.saved_bytes();
  // A resume loads into a model without gradients and an optimizer without state.
  for (auto& p : model_.parameters()) p.mutable_grad() = at::Tensor();
  if (!snapshot) {
    probes.resume.out_of_memory = true;
    return probes;
  }
  LoadedCheckpoint loaded;
  loaded.info.path = "the memory probe's checkpoint";
  loaded.meta = snapshot->meta;
  loaded.files = std::move(snapshot->files);
  try {
    auto optimizer = make_optimizer();
    meter_.reset_peak();
    const auto start = std::chrono::steady_clock::now();
    restore_state(loaded, model_, *optimizer);
    probes.resume.step_seconds = seconds_since(start);
  } catch (const c10::OutOfMemoryError& e) {
    probes.resume.out_of_memory = true;
  }
  probes.resume.peak_bytes = meter_.peak_bytes() - restore.saved_bytes();
  spdlog::debug("probe checkpoint capture: peak {} bytes; resume loading: peak {} bytes",
                probes.capture.peak_bytes, probes.resume.peak_bytes);
  return probes;
}

}  // namespace gpurun

#include "optim/flat_optimizer.h"

#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "gpurun/errors.h"
#include "model/precision.h"
#include "optim/grad_scaler.h"
#include "optim/step_collectives.h"

namespace gpurun {
namespace {

std::vector<std::pair<std::string, std::vector<int64_t>>> shapes_of(
    const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [name, p] : params) out.emplace_back(name, p.sizes().vec());
  return out;
}

at::Tensor host_zeros(int64_t n, c10::Device device) {
  auto options = at::TensorOptions().dtype(at::kFloat);
  // Pinned, so that the copies to and from the card are DMA that can overlap with kernels.
  if (device.is_cuda()) options = options.pinned_memory(true);
  return at::zeros({n}, options);
}

}  // namespace

FlatOptimizer::FlatOptimizer(const OptimConfig& optim, FlatOptimizerOptions options,
                             const std::vector<std::pair<std::string, at::Tensor>>& params,
                             StepCollectives* comm, int64_t rank, int64_t world_size)
    : optim_(optim),
      options_(options),
      comm_(comm),
      rank_(rank),
      layout_(shapes_of(params), world_size) {
  if (params.empty()) throw ConfigError("the optimizer has no trainable parameter");
  const at::Tensor& first = params.front().second;
  for (const auto& [name, p] : params) {
    if (p.scalar_type() != first.scalar_type() || p.device() != first.device())
      throw ConfigError("the sharded optimizer needs parameters of one dtype and device: " + name +
                        " is " + std::string(c10::toString(p.scalar_type())) + " on " +
                        p.device().str() + ", " + params.front().first + " " +
                        std::string(c10::toString(first.scalar_type())) + " on " +
                        first.device().str());
  }
  if (options_.master_weights && first.scalar_type() != at::kFloat &&
      first.scalar_type() != options_.half)
    throw ConfigError("optim.master_weights: the model's parameters are " +
                      std::string(c10::toString(first.scalar_type())) + ", not fp32 or " +
                      std::string(c10::toString(options_.half)));
  const c10::Device device = first.device();
  const auto dtype = options_.master_weights ? options_.half : first.scalar_type();
  const auto on_device = at::TensorOptions().device(device).dtype(dtype);
  at::NoGradGuard no_grad;
  // The parameters move into the buffer: each becomes a view of its place (set_data keeps
  // the autograd variable, so the model and its hooks see the same parameter), and its old
  // storage is freed as it goes.
  params_ = at::zeros({layout_.padded_numel()}, on_device);
  for (size_t i = 0; i < params.size(); ++i) {
    const FlatParameter& fp = layout_.parameters()[i];
    at::Tensor view = params_.narrow(0, fp.offset, fp.numel).view(fp.shape);
    view.copy_(params[i].second);
    at::Tensor p = params[i].second;
    p.set_data(view);
    views_.push_back(p);
  }
  ensure_gradient_buffer();
  const int64_t s = layout_.shard_numel();
  const auto state_zeros = [&] {
    return options_.offload ? host_zeros(s, device) : at::zeros({s}, on_device.dtype(at::kFloat));
  };
  if (options_.offload) host_grad_ = host_zeros(s, device);
  if (options_.master_weights || options_.offload) {
    master_ = state_zeros();
    reload_master_from_parameters();
  }
  if (optim_.name == "adam" || optim_.name == "adamw") {
    exp_avg_ = state_zeros();
    exp_avg_sq_ = state_zeros();
  } else if (optim_.momentum > 0) {
    momentum_ = state_zeros();
  }
  // The fused kernels read the step from a float tensor on the state's device, as
  // torch.optim's fused path keeps it.
  step_tensor_ = at::zeros({1}, at::TensorOptions()
                                    .dtype(at::kFloat)
                                    .device(options_.offload ? c10::Device(c10::kCPU) : device));
}

void FlatOptimizer::ensure_gradient_buffer() {
  if (grads_.defined()) return;
  grads_ = at::zeros({layout_.padded_numel()}, params_.options());
  for (size_t i = 0; i < views_.size(); ++i) {
    const FlatParameter& fp = layout_.parameters()[i];
    views_[i].mutable_grad() = grads_.narrow(0, fp.offset, fp.numel).view(fp.shape);
  }
}

void FlatOptimizer::zero_grad() {
  if (grads_.defined())
    grads_.zero_();
  else
    ensure_gradient_buffer();
}

void FlatOptimizer::release_full_gradients() {
  for (auto& p : views_) p.mutable_grad() = at::Tensor();
  grads_ = at::Tensor();
}

void FlatOptimizer::release_gradients() {
  release_full_gradients();
  grad_slice_ = at::Tensor();
}

at::Tensor FlatOptimizer::weights_slice() const {
  const ElementRange mine = shard();
  return params_.narrow(0, mine.begin, mine.size());
}

void FlatOptimizer::reload_master_from_parameters() {
  if (!master_.defined()) return;
  at::NoGradGuard no_grad;
  master_.copy_(weights_slice());
}

void FlatOptimizer::reduce_gradients(std::vector<double>& control) {
  at::NoGradGuard no_grad;
  ensure_gradient_buffer();  // a rank that ran out of memory contributes zeros
  const int64_t n = layout_.world_size(), s = layout_.shard_numel();
  if (comm_ && !control.empty()) control = comm_->all_reduce(control, StepCollectives::Op::kSum);
  if (!comm_) {
    // One process: with fp32 gradients to() returns the gradient buffer itself, no copy. A
    // copy would cost a buffer of the model's size every step (on the CPU, its page faults
    // too: 64 ms against 15 ms for the update itself, 19 M parameters); 16-bit ones are cast.
    grad_slice_ = grads_.narrow(0, rank_ * s, s).to(at::kFloat);
  } else {
    // From the reduce to the end of the update only: during the backward passes, the
    // activations' time, it takes no memory.
    grad_slice_ = at::empty({s}, params_.options().dtype(at::kFloat));
    // Column buckets of the [N, S] view: bucket k is every rank's elements [k c, (k + 1) c)
    // of its slice, summed in fp32 into this rank's grad_slice_[k c, (k + 1) c). A bucket
    // bounds the temporaries, ours and the ring's (Collectives::reduce_scatter), as DDP's do.
    const int64_t c = layout_.bucket_columns();
    const at::Tensor rows = grads_.view({n, s});
    for (int64_t k = 0; k < s; k += c) {
      const int64_t w = std::min(c, s - k);
      const at::Tensor bucket = rows.narrow(1, k, w).to(at::kFloat).contiguous().view({-1});
      comm_->reduce_scatter(bucket, grad_slice_.narrow(0, k, w));
    }
  }
  if (options_.release_gradients) release_full_gradients();
}

void FlatOptimizer::unscale(GradScaler& scaler) {
  scaler.unscale_tensors({grad_slice_});
  // An inf on any rank's slice skips the step on every rank.
  if (comm_)
    scaler.set_found_inf(comm_->all_reduce({scaler.found_inf()}, StepCollectives::Op::kMax)[0]);
}

double FlatOptimizer::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  // The sum of squares in float64, a chunk at a time: a float64 copy of the whole slice would
  // take 8 bytes a parameter of it (16 with its square), a 7B model's largest temporary. The
  // chunks are added in order into a 0-d float64 on the slice's device, read once.
  const int64_t s = grad_slice_.numel(), c = FlatLayout::kClipChunkElements;
  at::Tensor sum = at::zeros({}, grad_slice_.options().dtype(at::kDouble));
  for (int64_t k = 0; k < s; k += c) {
    at::Tensor chunk = grad_slice_.narrow(0, k, std::min(c, s - k)).to(at::kDouble);
    sum.add_(chunk.mul_(chunk).sum());
  }
  const double mine = sum.item<double>();
  double total = mine;
  if (comm_) {
    // One slot per rank: a sum of one non-zero value and zeros is exact, so every rank gets
    // every rank's value and adds them in the same order.
    std::vector<double> slots(static_cast<size_t>(layout_.world_size()), 0.0);
    slots[static_cast<size_t>(rank_)] = mine;
    slots = comm_->all_reduce(slots, StepCollectives::Op::kSum);
    total = 0;
    for (const double v : slots) total += v;
  }
  const double norm = std::sqrt(total);
  if (max_norm > 0 && norm > max_norm) grad_slice_.mul_(max_norm / (norm + 1e-6));
  return norm;
}

void FlatOptimizer::set_step_count(int64_t steps) {
  step_count_ = steps;
  step_tensor_.fill_(static_cast<double>(steps));
}

bool FlatOptimizer::step(double lr, GradScaler* scaler) {
  if (scaler && scaler->found_inf() != 0.0) {
    grad_slice_ = at::Tensor();
    return false;
  }
  at::NoGradGuard no_grad;
  at::Tensor grads = grad_slice_;
  if (options_.offload) {
    host_grad_.copy_(grad_slice_);
    grads = host_grad_;
  }
  at::Tensor weights = master_.defined() ? master_ : weights_slice();
  const bool first = step_count_ == 0;
  ++step_count_;
  step_tensor_.fill_(static_cast<double>(step_count_));
  const OptimConfig& o = optim_;
  if (o.name == "adamw") {
    at::_fused_adamw_({weights}, {grads}, {exp_avg_}, {exp_avg_sq_}, {}, {step_tensor_}, lr,
                      o.beta1, o.beta2, o.weight_decay, o.eps, false, false);
  } else if (o.name == "adam") {
    at::_fused_adam_({weights}, {grads}, {exp_avg_}, {exp_avg_sq_}, {}, {step_tensor_}, lr, o.beta1,
                     o.beta2, o.weight_decay, o.eps, false, false);
  } else {
    std::vector<at::Tensor> buffers;
    if (momentum_.defined()) buffers.push_back(momentum_);
    at::_fused_sgd_({weights}, {grads}, buffers, o.weight_decay, o.momentum, lr, 0.0, o.nesterov,
                    false, first);
  }
  // The new weights: this rank's slice (cast from the master) into every rank's parameter
  // buffer. The all-gather's input is a copy, never a view of its output.
  grad_slice_ = at::Tensor();
  if (!comm_) {
    if (master_.defined()) weights_slice().copy_(master_);
    return true;
  }
  const int64_t n = layout_.world_size(), s = layout_.shard_numel(), c = layout_.bucket_columns();
  const at::Tensor rows = params_.view({n, s});
  for (int64_t k = 0; k < s; k += c) {
    const int64_t w = std::min(c, s - k);
    const at::Tensor send = weights.narrow(0, k, w).to(params_.options(), false, /*copy=*/true);
    if (w == s) {
      comm_->all_gather(send, params_);  // one bucket: straight into the buffer
    } else {
      const at::Tensor gathered = at::empty({n * w}, params_.options());
      comm_->all_gather(send, gathered);
      rows.narrow(1, k, w).copy_(gathered.view({n, w}));
    }
  }
  return true;
}

std::vector<std::pair<std::string, at::Tensor>> FlatOptimizer::state() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (exp_avg_.defined()) out.emplace_back("exp_avg", exp_avg_);
  if (exp_avg_sq_.defined()) out.emplace_back("exp_avg_sq", exp_avg_sq_);
  if (momentum_.defined()) out.emplace_back("momentum_buffer", momentum_);
  if (master_.defined()) out.emplace_back("master", master_);
  return out;
}

int64_t FlatOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor* t : {&master_, &exp_avg_, &exp_avg_sq_, &momentum_})
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  return bytes;
}

}  // namespace gpurun

#include "checkpoint/format/state_copy.h"

#include <ATen/DeviceAccelerator.h>
#include <ATen/Parallel.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/output-archive.h>

#include <memory>
#include <optional>

#include "checkpoint/format/train_state.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "model/state_digest.h"

namespace gpurun {

namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamGroup;
using torch::optim::OptimizerParamState;

/// `buffer`, holding a copy of `live`: reused when it has live's shape and type, else
/// allocated (pinned for a device's tensor, whose copy is then queued, non-blocking).
at::Tensor copy_into(at::Tensor buffer, const at::Tensor& live, int64_t& bytes) {
  if (!live.defined()) return {};
  const at::Tensor source = live.detach();
  const bool device = !source.is_cpu();
  if (!buffer.defined() || buffer.sizes() != source.sizes() || buffer.dtype() != source.dtype()) {
    buffer =
        at::empty(source.sizes(),
                  source.options().device(at::kCPU).pinned_memory(device).requires_grad(false));
  }
  buffer.copy_(source, /*non_blocking=*/device);
  bytes += static_cast<int64_t>(source.nbytes());
  return buffer;
}

void copy_param_state(const torch::optim::SGDParamState& live, torch::optim::SGDParamState& host,
                      int64_t& bytes) {
  host.momentum_buffer(copy_into(host.momentum_buffer(), live.momentum_buffer(), bytes));
}

/// Adam's and AdamW's state (the SGD overload above is the better match for SGD's).
template <class AdamState>
void copy_param_state(const AdamState& live, AdamState& host, int64_t& bytes) {
  host.step(live.step());
  host.exp_avg(copy_into(host.exp_avg(), live.exp_avg(), bytes));
  host.exp_avg_sq(copy_into(host.exp_avg_sq(), live.exp_avg_sq(), bytes));
  host.max_exp_avg_sq(copy_into(host.max_exp_avg_sq(), live.max_exp_avg_sq(), bytes));
}

}  // namespace

/// An optimizer of the live one's type over placeholder parameters (the archive records a
/// parameter by its position, never its values), holding host copies of the live state: its
/// save() writes the archive the live optimizer's save() would.
struct HostStateCopy::OptimizerCopy {
  std::unique_ptr<Optimizer> host;
  std::vector<std::vector<at::Tensor>> placeholders;  ///< per parameter group
  /// Copies the live optimizer's options and per-parameter state into `host`.
  void (*refresh)(const Optimizer& live, OptimizerCopy& copy, int64_t& bytes) = nullptr;
};

namespace {

template <class Opt, class Options, class State>
std::unique_ptr<HostStateCopy::OptimizerCopy> optimizer_copy(const Optimizer& live) {
  auto copy = std::make_unique<HostStateCopy::OptimizerCopy>();
  std::vector<OptimizerParamGroup> groups;
  for (const OptimizerParamGroup& group : live.param_groups()) {
    std::vector<at::Tensor> placeholders;
    for (size_t i = 0; i < group.params().size(); ++i) placeholders.push_back(at::empty({0}));
    copy->placeholders.push_back(placeholders);
    groups.emplace_back(placeholders, group.options().clone());
  }
  copy->host =
      std::make_unique<Opt>(std::move(groups), static_cast<const Options&>(live.defaults()));
  copy->refresh = [](const Optimizer& from, HostStateCopy::OptimizerCopy& to, int64_t& bytes) {
    for (size_t g = 0; g < from.param_groups().size(); ++g) {
      const OptimizerParamGroup& group = from.param_groups()[g];
      // The learning rate changes every step (the schedule): the options of this step.
      to.host->param_groups()[g].set_options(group.options().clone());
      for (size_t i = 0; i < group.params().size(); ++i) {
        void* key = to.placeholders[g][i].unsafeGetTensorImpl();
        auto live_state = from.state().find(group.params()[i].unsafeGetTensorImpl());
        if (live_state == from.state().end()) {
          to.host->state().erase(key);  // no step taken for it yet
          continue;
        }
        auto& slot = to.host->state()[key];
        if (!slot) slot = std::make_unique<State>();
        copy_param_state(static_cast<const State&>(*live_state->second), static_cast<State&>(*slot),
                         bytes);
      }
    }
  };
  return copy;
}

std::unique_ptr<HostStateCopy::OptimizerCopy> make_optimizer_copy(const Optimizer& live) {
  namespace optim = torch::optim;
  if (dynamic_cast<const optim::AdamW*>(&live))
    return optimizer_copy<optim::AdamW, optim::AdamWOptions, optim::AdamWParamState>(live);
  if (dynamic_cast<const optim::Adam*>(&live))
    return optimizer_copy<optim::Adam, optim::AdamOptions, optim::AdamParamState>(live);
  if (dynamic_cast<const optim::SGD*>(&live))
    return optimizer_copy<optim::SGD, optim::SGDOptions, optim::SGDParamState>(live);
  throw ConfigError("checkpoints can copy the state of SGD, Adam and AdamW only");
}

bool same_shape(const HostStateCopy::OptimizerCopy& copy, const Optimizer& live) {
  if (copy.placeholders.size() != live.param_groups().size()) return false;
  for (size_t g = 0; g < copy.placeholders.size(); ++g)
    if (copy.placeholders[g].size() != live.param_groups()[g].params().size()) return false;
  return true;
}

}  // namespace

HostStateCopy::HostStateCopy() = default;
HostStateCopy::~HostStateCopy() = default;

void HostStateCopy::copy(const torch::nn::Module& model, const Optimizer& optimizer,
                         NamedTensors rng_states) {
  const std::optional<c10::Device> device = copy_model(model);
  if (!optimizer_ || !same_shape(*optimizer_, optimizer))
    optimizer_ = make_optimizer_copy(optimizer);
  optimizer_->refresh(optimizer, *optimizer_, copied_bytes_);
  finish_copy(device, std::move(rng_states));
}

void HostStateCopy::copy(const torch::nn::Module& model, NamedTensors rng_states) {
  const std::optional<c10::Device> device = copy_model(model);
  optimizer_.reset();  // a sharded save: the optimizer's state is in the shard files
  finish_copy(device, std::move(rng_states));
}

std::optional<c10::Device> HostStateCopy::copy_model(const torch::nn::Module& model) {
  copied_bytes_ = 0;
  const NamedTensors live = state_dict(model);
  weights_.resize(live.size());
  std::optional<c10::Device> device;
  for (size_t i = 0; i < live.size(); ++i) {
    weights_[i].first = live[i].first;
    weights_[i].second = copy_into(weights_[i].second, live[i].second, copied_bytes_);
    if (!device && !live[i].second.is_cpu()) device = live[i].second.device();
  }
  return device;
}

void HostStateCopy::finish_copy(std::optional<c10::Device> device, NamedTensors rng_states) {
  rng_ = std::move(rng_states);
  threads_ = at::get_num_threads();  // OpenMP's thread count is per thread: the trainer's
  on_device_ = device.has_value();
  if (device) {
    if (!copied_ || copied_->device_type() != device->type())
      copied_ = std::make_unique<c10::Event>(device->type());
    copied_->record(at::accelerator::getCurrentStream(device->index()));
  }
}

void HostStateCopy::build(CheckpointSnapshot& snapshot) {
  if (on_device_) copied_->synchronize();
  snapshot.meta.model_digest = state_digest(weights_);
  snapshot.meta.threads = threads_;
  snapshot.meta.cpu_capability = cpu_capability();
  // The optimizer's archive (none for a sharded copy) refers to the host copy's tensors;
  // nothing is serialized yet.
  std::shared_ptr<torch::serialize::OutputArchive> optim;
  if (optimizer_) {
    optim = std::make_shared<torch::serialize::OutputArchive>();
    optimizer_->host->save(*optim);
  }
  // Each file is serialized as the store writes it, every tensor's bytes straight from its
  // buffer. The sources hold the buffers (tensors share their storage) until the snapshot is
  // destroyed after the write, so that release() below leaves them to it.
  snapshot.files.clear();
  snapshot.streamed.clear();
  snapshot.streamed.emplace_back(
      "model.pt", [weights = weights_](const ByteSink& out) { pickle_tensors(weights, out); });
  if (optim) {
    snapshot.streamed.emplace_back("optim.pt", [optim](const ByteSink& out) {
      write_archive(out, [&](const ArchiveWriterFunction& writer, const bool& /*failed*/) {
        optim->save_to(writer);
      });
    });
  }
  snapshot.streamed.emplace_back(
      "trainer.pt", [rng = std::move(rng_)](const ByteSink& out) { pickle_tensors(rng, out); });
  rng_.clear();
  // A CPU run's buffers are its device memory: they stay only where the plan counts them.
  if (!on_device_ && !keep_) release();
}

void HostStateCopy::keep_buffers(bool keep) {
  keep_ = keep;
  if (!on_device_ && !keep_) release();
}

void HostStateCopy::release() {
  weights_.clear();
  optimizer_.reset();
}

}  // namespace gpurun

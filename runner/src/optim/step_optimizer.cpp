#include "optim/step_optimizer.h"

#include <torch/optim/optimizer.h>

#include <spdlog/spdlog.h>

#include "gpurun/errors.h"
#include "model/precision.h"
#include "optim/flat_optimizer.h"
#include "optim/grad_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/step_collectives.h"
#include "optim/torch_optimizer.h"

namespace gpurun {
namespace {

/// LibTorch's optimizer, its state replicated on every rank; gradients all-reduced (DDP).
class ReplicatedOptimizer final : public StepOptimizer {
 public:
  ReplicatedOptimizer(const OptimConfig& optim, std::vector<at::Tensor> params,
                      StepCollectives* comm)
      : params_(std::move(params)), optimizer_(make_optimizer(optim, params_)), comm_(comm) {}

  void zero_grad() override { optimizer_->zero_grad(); }
  void release_gradients() override {
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
  }
  void reduce_gradients(std::vector<double>& control) override {
    if (comm_) comm_->sync_gradients(params_, control);
  }
  void unscale(GradScaler& scaler) override { scaler.unscale(params_); }
  double clip_grad_norm(double max_norm) override {
    return gpurun::clip_grad_norm(params_, max_norm);
  }
  bool step(double lr, GradScaler* scaler) override {
    set_learning_rate(*optimizer_, lr);
    if (scaler) return scaler->step(*optimizer_, params_);
    optimizer_->step();
    return true;
  }
  torch::optim::Optimizer* replicated() override { return optimizer_.get(); }

 private:
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  StepCollectives* comm_;
};

}  // namespace

OptimizerPlacement resolve_placement(const RunConfig& config, const std::string& shard,
                                     bool offload, int world_size, Precision precision) {
  OptimizerPlacement p;
  p.shard = shard;
  p.master_weights = uses_master_weights(config, precision);
  if (config.optim.master_weights && !p.master_weights)
    spdlog::info("optim.master_weights: the run trains in fp32; its weights are the master");
  p.offload = offload;
  // A flat optimizer over several ranks shards its state whatever the shard mode says.
  std::string what = !p.flat() ? "replicated"
                     : world_size == 1
                         ? "flat (one rank holds the whole state)"
                         : "sharded (" + (p.shard == "none" ? std::string("optimizer") : p.shard) +
                               ") over " + std::to_string(world_size) + " ranks";
  if (p.master_weights) what += ", 16-bit weights with fp32 master weights";
  if (p.offload) what += ", state and step in host memory";
  spdlog::info("optimizer: {}", what);
  return p;
}

c10::ScalarType half_dtype(Precision precision) {
  return precision == Precision::kFp16 ? at::kHalf : at::kBFloat16;
}

bool uses_master_weights(const RunConfig& config, Precision precision) {
  return config.optim.master_weights && precision != Precision::kFp32;
}

std::optional<c10::ScalarType> held_dtype(const RunConfig& config, Precision precision) {
  if (!uses_master_weights(config, precision)) return std::nullopt;
  return half_dtype(precision);
}

std::unique_ptr<StepOptimizer> make_step_optimizer(
    const OptimConfig& optim, const OptimizerPlacement& placement,
    const std::vector<std::pair<std::string, at::Tensor>>& params, StepCollectives* comm,
    c10::ScalarType half) {
  if (!placement.flat()) {
    std::vector<at::Tensor> tensors;
    for (const auto& entry : params) tensors.push_back(entry.second);
    return std::make_unique<ReplicatedOptimizer>(optim, std::move(tensors), comm);
  }
  FlatOptimizerOptions options;
  options.release_gradients = placement.shard == "gradients";
  options.master_weights = placement.master_weights;
  options.half = half;
  options.offload = placement.offload;
  return std::make_unique<FlatOptimizer>(optim, options, params, comm, comm ? comm->rank() : 0,
                                         comm ? comm->world_size() : 1);
}

}  // namespace gpurun

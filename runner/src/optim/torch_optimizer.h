// LibTorch's optimizers from the config (the replicated placement, optim/step_optimizer.h),
// their learning rate and gradient clipping.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/optim/optimizer.h>

#include "gpurun/config.h"

namespace gpurun {

/// SGD (momentum, Nesterov), Adam or AdamW over `params`, as LibTorch implements them (the
/// same update rules as torch.optim in PyTorch). Weight decay is L2 added to the gradient for
/// SGD and Adam, decoupled for AdamW (Loshchilov & Hutter 2019).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimConfig& config,
                                                        std::vector<torch::Tensor> params);

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

/// Scales the gradients so that their global L2 norm is at most `max_norm` (as PyTorch's
/// clip_grad_norm_); returns the norm before clipping.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace gpurun

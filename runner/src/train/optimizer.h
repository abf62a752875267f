// Optimizers and learning-rate schedules from the config.
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

/// The learning rate for optimizer step `step` (0-based) of `total_steps`. A pure function of
/// the step, so a resumed run needs no scheduler state beyond global_step, and the schedule
/// advances once per optimizer step, never per micro-batch.
///   warm-up (step < warmup_steps): lr * (step + 1) / warmup_steps
///   constant: lr
///   step:     lr * gamma^floor(step / step_size)
///   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2, t = (step - warmup) / (total -
///   warmup)
///             (SGDR, Loshchilov & Hutter 2017, without restarts)
double learning_rate(const OptimConfig& optim, const ScheduleConfig& schedule, int64_t step,
                     int64_t total_steps);

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

/// Scales the gradients so that their global L2 norm is at most `max_norm` (as PyTorch's
/// clip_grad_norm_); returns the norm before clipping.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace gpurun

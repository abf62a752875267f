#include "train/optimizer.h"

#include <ATen/ops/cat.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>

#include "gpurun/errors.h"

namespace gpurun {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimConfig& c,
                                                        std::vector<torch::Tensor> params) {
  if (c.name == "sgd")
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(c.lr)
                                                           .momentum(c.momentum)
                                                           .nesterov(c.nesterov)
                                                           .weight_decay(c.weight_decay));
  if (c.name == "adam")
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(c.lr)
                                                            .betas({c.beta1, c.beta2})
                                                            .eps(c.eps)
                                                            .weight_decay(c.weight_decay));
  if (c.name == "adamw")
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(c.lr)
                                                             .betas({c.beta1, c.beta2})
                                                             .eps(c.eps)
                                                             .weight_decay(c.weight_decay));
  throw ConfigError("optim.name: unknown optimizer \"" + c.name + "\"; use sgd, adam or adamw");
}

double learning_rate(const OptimConfig& optim, const ScheduleConfig& s, int64_t step,
                     int64_t total_steps) {
  const double lr = optim.lr;
  if (step < s.warmup_steps) return lr * static_cast<double>(step + 1) / s.warmup_steps;
  if (s.name == "step") return lr * std::pow(s.gamma, static_cast<double>(step / s.step_size));
  if (s.name == "cosine") {
    const int64_t span = std::max<int64_t>(1, total_steps - s.warmup_steps - 1);
    const double t = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
    return s.min_lr + (lr - s.min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
  }
  return lr;
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(p.grad().detach().norm(2).unsqueeze(0));
  if (norms.empty()) return 0.0;
  const double total = at::cat(norms).norm(2).item<double>();
  if (max_norm > 0 && total > max_norm) {
    const double scale = max_norm / (total + 1e-6);
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().detach().mul_(scale);
  }
  return total;
}

}  // namespace gpurun

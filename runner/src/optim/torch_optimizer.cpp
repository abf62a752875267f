#include "optim/torch_optimizer.h"

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

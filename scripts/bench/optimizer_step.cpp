// The optimizer step alone, on the parameters of the model a run.yaml builds: LibTorch's
// AdamW (a loop over parameters, several ATen ops each) against gpurun's flat optimizer on
// one rank (ATen's fused AdamW kernel over the flat buffer). Random gradients, set once as the
// Python side sets them (the update alone is timed); the median of
// `steps` steps after 3 warm-up steps. Prints one JSON line; optimizer_step.sh adds PyTorch's.
// Usage: gpurun_bench_optimizer RUN.yaml [STEPS] [--set KEY=VALUE ...]
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "builtin.h"
#include "gpurun/config.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "model/fine_tune.h"
#include "optim/flat_optimizer.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Step>
double time_steps(int steps, const Step& step) {
  std::vector<double> seconds;
  for (int i = 0; i < steps + 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    if (i >= 3)
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median(seconds);
}

void random_grads(const std::vector<at::Tensor>& params) {
  for (auto p : params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    p.mutable_grad().normal_(0, 1e-3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: gpurun_bench_optimizer RUN.yaml [STEPS] [--set KEY=VALUE ...]\n";
    return 2;
  }
  const int steps = argc > 2 && argv[2][0] != '-' ? std::stoi(argv[2]) : 10;
  std::vector<std::string> sets;
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--set" && i + 1 < argc) sets.push_back(argv[++i]);
  const gpurun::RunConfig c = gpurun::load_config(argv[1], sets);
  if (c.train.threads > 0) at::set_num_threads(static_cast<int>(c.train.threads));
  gpurun::Registry registry;
  gpurun::register_builtin_plugins(registry);
  gpurun::DatasetSplits data = registry.make_dataset(c.data);
  gpurun::OptimConfig optim = c.optim;
  optim.name = "adamw";

  auto model = registry.make_model(c.model, data.input_shape, data.num_classes);
  const std::vector<at::Tensor> params = gpurun::trainable_parameters(*model);
  int64_t numel = 0;
  nlohmann::json shapes = nlohmann::json::array();
  for (const auto& p : params) {
    numel += p.numel();
    shapes.push_back(p.sizes().vec());
  }
  torch::optim::AdamW libtorch(
      params, torch::optim::AdamWOptions(optim.lr).weight_decay(optim.weight_decay));
  random_grads(params);
  const double per_parameter = time_steps(steps, [&] { libtorch.step(); });

  auto flat_model = registry.make_model(c.model, data.input_shape, data.num_classes);
  gpurun::FlatOptimizer flat(optim, {}, gpurun::named_trainable_parameters(*flat_model), nullptr);
  std::vector<double> control;
  // The gradients once, as for LibTorch's and Python's: the update alone is timed (the fused
  // kernel does not change them).
  random_grads(gpurun::trainable_parameters(*flat_model));
  const double fused = time_steps(steps, [&] {
    flat.reduce_gradients(control);  // one process: the slice is the gradient buffer
    flat.step(optim.lr, nullptr);
  });
  std::cout << nlohmann::json{{"parameters", numel},
                              {"tensors", params.size()},
                              {"threads", at::get_num_threads()},
                              {"libtorch_adamw_seconds", per_parameter},
                              {"flat_fused_adamw_seconds", fused},
                              {"shapes", shapes}}
                   .dump()
            << "\n";
  return 0;
}

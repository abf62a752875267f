// The baseline of scripts/bench/throughput.sh: a minimal hand-written LibTorch training loop
// (shuffle, forward, cross-entropy, backward, Adam step) on the same model and data as a
// gpurun config, with none of gpurun's machinery. Prints one JSON line with samples/s.
//
// Usage: gpurun_bench_plain_loop CONFIG.yaml [KEY=VALUE...]
#include <ATen/Parallel.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <torch/utils.h>

#include <chrono>
#include <iostream>

#include <nlohmann/json.hpp>

#include "builtin.h"
#include "gpurun/config.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "optim/torch_optimizer.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: gpurun_bench_plain_loop CONFIG.yaml [KEY=VALUE...]\n";
    return 2;
  }
  const gpurun::RunConfig c = gpurun::load_config(argv[1], {argv + 2, argv + argc});
  if (c.train.threads > 0) at::set_num_threads(static_cast<int>(c.train.threads));
  torch::manual_seed(static_cast<uint64_t>(c.train.seed));
  gpurun::Registry registry;
  gpurun::register_builtin_plugins(registry);
  gpurun::DatasetSplits data = registry.make_dataset(c.data);
  auto model = registry.make_model(c.model, data.input_shape, data.num_classes);
  auto optimizer = gpurun::make_optimizer(c.optim, model->parameters());
  model->train();
  const int64_t n = data.train->size(), batch = c.train.batch_size;
  // Timed from the end of step `skip` (warm-up excluded), as gpurun's samples/s between its
  // first and last `step` events.
  const int64_t skip = c.log.every_steps;
  int64_t samples = 0, step = 0;
  auto start = std::chrono::steady_clock::now();
  for (int64_t epoch = 0; epoch < c.train.epochs; ++epoch) {
    at::Tensor order = at::randperm(n, at::kLong);
    for (int64_t pos = 0; pos < n; pos += batch) {
      const int64_t count = std::min(batch, n - pos);
      gpurun::Batch b = data.train->get(order.narrow(0, pos, count));
      optimizer->zero_grad();
      at::Tensor loss = at::cross_entropy_loss(model->forward(b.inputs), b.targets);
      loss.backward();
      optimizer->step();
      if (++step == skip) start = std::chrono::steady_clock::now();
      if (step > skip) samples += count;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << nlohmann::json{{"samples", samples},
                              {"seconds", seconds},
                              {"samples_per_second", samples / seconds},
                              {"threads", at::get_num_threads()}}
                   .dump()
            << "\n";
  return 0;
}

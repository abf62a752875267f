// The `synthetic` dataset: seeded random classification data for tests and benchmarks.
//
// Gaussian classes: every class c has a mean m_c ~ N(0, 9/D I) over the D values of a sample
// (so means are about 3 apart whatever D); sample i has label y_i uniform in [0, classes)
// and x_i = m_{y_i} + e_i with e_i ~ N(0, I). Learnable (the Bayes accuracy is high, not 1),
// and a pure function of data.seed: drawn from a CPU generator (mt19937) of its own, seeded
// with data.seed alone, so the training RNG neither changes it nor is changed by it. The
// first data.samples x (1 - data.eval_fraction) samples train, the rest evaluate.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include <cmath>

#include "data/builtin_datasets.h"
#include "gpurun/errors.h"
#include "gpurun/registry.h"

namespace gpurun {
namespace {

DatasetSplits load_synthetic(const DataConfig& c) {
  int64_t values = 1;
  for (int64_t d : c.shape) values *= d;
  const int64_t n = c.samples;
  const auto eval_n = std::max<int64_t>(1, std::llround(c.eval_fraction * n));
  if (eval_n >= n)
    throw ConfigError("data.samples " + std::to_string(n) + " with data.eval_fraction " +
                      std::to_string(c.eval_fraction) + " leaves no training samples");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.seed));
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor means = at::randn({c.classes, values}, gen, f32).mul_(3.0 / std::sqrt(values));
  at::Tensor labels = at::randint(c.classes, {n}, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor x = at::index_select(means, 0, labels).add_(at::randn({n, values}, gen, f32));
  std::vector<int64_t> sizes{n};
  sizes.insert(sizes.end(), c.shape.begin(), c.shape.end());
  x = x.view(sizes);

  const int64_t train_n = n - eval_n;
  const auto first = [](int64_t available, int64_t limit) {
    return limit > 0 ? std::min(available, limit) : available;
  };
  if (c.train_samples > train_n || c.eval_samples > eval_n)
    throw ConfigError("data.train_samples/eval_samples: asked for " +
                      std::to_string(c.train_samples) + "/" + std::to_string(c.eval_samples) +
                      " samples; data.samples " + std::to_string(n) + " gives " +
                      std::to_string(train_n) + "/" + std::to_string(eval_n));
  DatasetSplits splits;
  splits.train =
      std::make_shared<TensorDataset>(x.narrow(0, 0, first(train_n, c.train_samples)),
                                      labels.narrow(0, 0, first(train_n, c.train_samples)));
  splits.eval =
      std::make_shared<TensorDataset>(x.narrow(0, train_n, first(eval_n, c.eval_samples)),
                                      labels.narrow(0, train_n, first(eval_n, c.eval_samples)));
  splits.input_shape = c.shape;
  splits.num_classes = c.classes;
  return splits;
}

}  // namespace

void register_synthetic_dataset(Registry& registry) {
  registry.add_dataset("synthetic", load_synthetic);
}

}  // namespace gpurun

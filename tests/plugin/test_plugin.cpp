// A plugin built in the test tree (plugin.h): model "test_mlp" (two segments) and dataset
// "test_blobs" (Gaussian clusters), used by the plugin loader and integration tests.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

#include "gpurun/dataset.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/plugin.h"
#include "gpurun/registry.h"

namespace {

constexpr int64_t kFeatures = 8;
constexpr int64_t kClasses = 4;

/// flatten -> linear(hidden[0]) -> relu | linear(classes): segments "body" and "head".
std::shared_ptr<gpurun::SegmentedModel> make_test_mlp(const gpurun::ModelConfig& config,
                                                      const std::vector<int64_t>& input_shape,
                                                      int64_t num_classes) {
  if (config.hidden.empty()) throw gpurun::ConfigError("test_mlp needs model.hidden: [WIDTH]");
  int64_t inputs = 1;
  for (int64_t d : input_shape) inputs *= d;
  auto model = std::make_shared<gpurun::SegmentedModel>();
  torch::nn::Sequential body(torch::nn::Flatten(), torch::nn::Linear(inputs, config.hidden[0]),
                             torch::nn::ReLU());
  model->add_segment("body", body);
  model->add_segment("head",
                     torch::nn::Sequential(torch::nn::Linear(config.hidden[0], num_classes)));
  return model;
}

/// kClasses clusters in kFeatures dimensions; sample i has class i % kClasses. Deterministic:
/// drawn from a generator of its own (seed 7), so the global RNG is untouched.
gpurun::DatasetSplits make_test_blobs(const gpurun::DataConfig& config) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor centers = at::randn({kClasses, kFeatures}, gen) * 3;
  const auto split = [&](int64_t n) {
    const at::Tensor targets = at::arange(n, at::kLong).remainder(kClasses);
    const at::Tensor inputs = centers.index_select(0, targets) + at::randn({n, kFeatures}, gen);
    return std::make_shared<gpurun::TensorDataset>(inputs, targets);
  };
  gpurun::DatasetSplits splits;
  splits.train = split(config.train_samples > 0 ? config.train_samples : 512);
  splits.eval = split(config.eval_samples > 0 ? config.eval_samples : 128);
  splits.input_shape = {kFeatures};
  splits.num_classes = kClasses;
  return splits;
}

}  // namespace

GPURUN_PLUGIN(registry) {
  registry.add_model("test_mlp", make_test_mlp);
  registry.add_dataset("test_blobs", make_test_blobs);
}

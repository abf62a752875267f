// A plugin built in the test tree (plugin.h): model "test_mlp" (two segments) and datasets
// "test_blobs" (Gaussian clusters) and "test_slow_blobs" (the same, slowed or failing on
// request), used by the plugin loader and integration tests.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

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

/// `name` from the environment as an integer; `otherwise` when unset.
int64_t env_int(const char* name, int64_t otherwise) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoll(v) : otherwise;
}

/// A training split whose every get_batch sleeps GPURUN_TEST_DATA_SLEEP_MS (a slow disk or
/// decoder) and throws, naming a file, when it holds sample GPURUN_TEST_DATA_THROW_AT (a
/// corrupt file): the loader's tests (data/loader.h). Safe for concurrent calls.
class SlowData : public gpurun::Dataset {
 public:
  explicit SlowData(std::shared_ptr<gpurun::Dataset> inner)
      : inner_(std::move(inner)),
        sleep_ms_(env_int("GPURUN_TEST_DATA_SLEEP_MS", 0)),
        throw_at_(env_int("GPURUN_TEST_DATA_THROW_AT", -1)) {}
  int64_t size() const override { return inner_->size(); }
  gpurun::Batch get(const at::Tensor& indices) const override { return inner_->get(indices); }
  gpurun::Batch get_batch(const at::Tensor& indices,
                          const gpurun::BatchContext& context) const override {
    (void)context;
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    if (throw_at_ >= 0 && indices.eq(throw_at_).any().item<bool>())
      throw std::runtime_error("cannot decode /data/blobs/sample-" + std::to_string(throw_at_) +
                               ".bin: truncated");
    return inner_->get(indices);
  }

 private:
  std::shared_ptr<gpurun::Dataset> inner_;
  int64_t sleep_ms_, throw_at_;
};

gpurun::DatasetSplits make_test_slow_blobs(const gpurun::DataConfig& config) {
  gpurun::DatasetSplits splits = make_test_blobs(config);
  splits.train = std::make_shared<SlowData>(splits.train);
  return splits;
}

}  // namespace

GPURUN_PLUGIN(registry) {
  registry.add_model("test_mlp", make_test_mlp);
  registry.add_dataset("test_blobs", make_test_blobs);
  registry.add_dataset("test_slow_blobs", make_test_slow_blobs);
}

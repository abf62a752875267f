// An example gpurun plugin: the model "tiny_mlp", a two-segment MLP.
//
// A model is a gpurun::SegmentedModel: a chain of named segments (torch::nn::Sequential), the
// units gpurun may run with activation checkpointing when the device is short of memory. The
// factory receives the model section of run.yaml (model.hidden, model.dropout, ...) and the
// shape of one sample and the class count of the dataset, and returns the model; it may throw
// gpurun::ConfigError for a setting it cannot use (gpurun exits 2 with the message).
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include <gpurun/errors.h>
#include <gpurun/model.h>
#include <gpurun/plugin.h>
#include <gpurun/registry.h>

namespace {

/// flatten -> linear(hidden[0]) -> relu [-> dropout]  |  linear(classes)
/// segment "features"                                     segment "classifier"
std::shared_ptr<gpurun::SegmentedModel> make_tiny_mlp(const gpurun::ModelConfig& config,
                                                      const std::vector<int64_t>& input_shape,
                                                      int64_t num_classes) {
  if (config.hidden.size() != 1)
    throw gpurun::ConfigError("tiny_mlp takes one hidden width, e.g. model.hidden: [128]; got " +
                              std::to_string(config.hidden.size()));
  int64_t inputs = 1;
  for (int64_t d : input_shape) inputs *= d;
  const int64_t width = config.hidden[0];

  torch::nn::Sequential features(torch::nn::Flatten(), torch::nn::Linear(inputs, width),
                                 torch::nn::ReLU());
  if (config.dropout > 0) features->push_back(torch::nn::Dropout(config.dropout));
  auto model = std::make_shared<gpurun::SegmentedModel>();
  model->add_segment("features", features);
  model->add_segment("classifier", torch::nn::Sequential(torch::nn::Linear(width, num_classes)));
  return model;
}

}  // namespace

// Defines gpurun_plugin_abi_version, gpurun_plugin_torch_version and gpurun_plugin_init; the
// block is called with gpurun's registry once, when the plugin is loaded.
GPURUN_PLUGIN(registry) { registry.add_model("tiny_mlp", make_tiny_mlp); }

// Built-in models: `mlp` and `cnn`, each built from segments (the units of activation
// checkpointing).
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "builtin.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"

namespace gpurun {
namespace {

namespace nn = torch::nn;

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

/// flatten -> [linear -> relu -> dropout] per hidden width -> linear. One segment per hidden
/// layer, the last linear layer its own segment.
std::shared_ptr<SegmentedModel> make_mlp(const ModelConfig& c, const std::vector<int64_t>& shape,
                                         int64_t num_classes) {
  auto model = std::make_shared<SegmentedModel>();
  int64_t width = product(shape);
  for (size_t i = 0; i < c.hidden.size(); ++i) {
    nn::Sequential block;
    if (i == 0) block->push_back(nn::Flatten());
    block->push_back(nn::Linear(width, c.hidden[i]));
    block->push_back(nn::ReLU());
    if (c.dropout > 0) block->push_back(nn::Dropout(c.dropout));
    model->add_segment("block" + std::to_string(i), block);
    width = c.hidden[i];
  }
  nn::Sequential head;
  if (c.hidden.empty()) head->push_back(nn::Flatten());
  head->push_back(nn::Linear(width, num_classes));
  model->add_segment("head", head);
  return model;
}

/// Per channel count: conv 3x3 (padding 1) -> [BatchNorm] -> relu -> max-pool 2x2, one segment
/// each; then flatten -> dropout -> linear 128 -> relu -> dropout -> linear, the head segment.
std::shared_ptr<SegmentedModel> make_cnn(const ModelConfig& c, const std::vector<int64_t>& shape,
                                         int64_t num_classes) {
  if (shape.size() != 3)
    throw ConfigError(
        "model cnn needs image samples [channels, height, width]; the dataset gives " +
        std::to_string(shape.size()) + " dimensions");
  auto model = std::make_shared<SegmentedModel>();
  int64_t in = shape[0], h = shape[1], w = shape[2];
  for (size_t i = 0; i < c.channels.size(); ++i) {
    if (h < 2 || w < 2)
      throw ConfigError("model.channels: " + std::to_string(c.channels.size()) +
                        " conv blocks pool a " + std::to_string(shape[1]) + "x" +
                        std::to_string(shape[2]) + " input below 1x1; use fewer blocks");
    nn::Sequential block;
    block->push_back(
        nn::Conv2d(nn::Conv2dOptions(in, c.channels[i], 3).padding(1).bias(!c.batch_norm)));
    if (c.batch_norm) block->push_back(nn::BatchNorm2d(c.channels[i]));
    block->push_back(nn::ReLU());
    block->push_back(nn::MaxPool2d(2));
    model->add_segment("block" + std::to_string(i), block);
    in = c.channels[i];
    h /= 2;
    w /= 2;
  }
  nn::Sequential head;
  head->push_back(nn::Flatten());
  if (c.dropout > 0) head->push_back(nn::Dropout(c.dropout));
  head->push_back(nn::Linear(in * h * w, 128));
  head->push_back(nn::ReLU());
  if (c.dropout > 0) head->push_back(nn::Dropout(c.dropout));
  head->push_back(nn::Linear(128, num_classes));
  model->add_segment("head", head);
  return model;
}

}  // namespace

void register_builtin_models(Registry& registry) {
  registry.add_model("mlp", make_mlp);
  registry.add_model("cnn", make_cnn);
  register_resnet_model(registry);
  register_gpt_model(registry);
  register_hf_model(registry);
}

}  // namespace gpurun

// The `resnet` model: a small residual network for 28x28 and 32x32 images (He et al. 2016,
// "Deep Residual Learning for Image Recognition", section 4.2, the CIFAR-10 networks).
//
// stem: conv 3x3 -> BatchNorm -> ReLU to model.channels[0]; then one stage per entry of
// model.channels with model.blocks[s] basic blocks each (two 3x3 convolutions with BatchNorm,
// plus the skip connection); the first block of every stage after the first halves the
// resolution with stride 2 and takes a projection shortcut (1x1 conv + BatchNorm, the paper's
// option B); head: global average pooling -> linear. Segments: the stem, every residual
// block, the head. Convolutions are initialised as in the paper (He et al. 2015, fan-out).
#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "builtin.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"

namespace gpurun {
namespace {

namespace nn = torch::nn;

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  nn::Conv2d c(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
  nn::init::kaiming_normal_(c->weight, 0, torch::kFanOut, torch::kReLU);
  return c;
}

/// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)): [N, in, H, W] -> [N, out, H/s, W/s].
/// A module with forward(Tensor), so that it can sit in a Sequential segment.
class BasicBlockImpl : public nn::Module {
 public:
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1_(register_module("conv1", conv(in, out, 3, stride))),
        bn1_(register_module("bn1", nn::BatchNorm2d(out))),
        conv2_(register_module("conv2", conv(out, out, 3, 1))),
        bn2_(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out)
      shortcut_ = register_module("shortcut",
                                  nn::Sequential(conv(in, out, 1, stride), nn::BatchNorm2d(out)));
  }

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = nn::functional::relu(bn1_(conv1_(x)));
    y = bn2_(conv2_(y));
    return nn::functional::relu(y + (shortcut_.is_empty() ? x : shortcut_->forward(x)));
  }

 private:
  nn::Conv2d conv1_;
  nn::BatchNorm2d bn1_;
  nn::Conv2d conv2_;
  nn::BatchNorm2d bn2_;
  nn::Sequential shortcut_{nullptr};
};
TORCH_MODULE(BasicBlock);

/// What autograd keeps per sample, segment by segment, following the forward passes above
/// (each op's backward formula in PyTorch's derivatives.yaml): a convolution keeps its input (a
/// ReLU's output, kept once), BatchNorm its input, ReLU its output. c: the dtype of the
/// convolutions' outputs (2 under autocast, else 4), in which BatchNorm and ReLU then run.
std::vector<SegmentActivations> resnet_activations(const std::vector<int64_t>& shape,
                                                   const std::vector<int64_t>& channels,
                                                   const std::vector<int64_t>& blocks,
                                                   int64_t num_classes, const ActivationDtypes& d) {
  const int64_t c = d.compute;
  int64_t h = shape[1], w = shape[2], in = channels[0];
  std::vector<SegmentActivations> out;
  // Stem: the image (cast to c for the convolution), BatchNorm's input, ReLU's output.
  const int64_t image = shape[0] * h * w;
  const int64_t stem = channels[0] * h * w * c;
  // FLOPs: 2 x input channels x 9 (3x3) per output element of each convolution.
  auto conv_flops = [](int64_t in_channels, int64_t outputs, int64_t kernel) {
    return 2.0 * static_cast<double>(in_channels * kernel * kernel) * static_cast<double>(outputs);
  };
  out.push_back(
      {image * 4, image * c + 2 * stem, stem, conv_flops(shape[0], channels[0] * h * w, 3)});
  for (size_t s = 0; s < channels.size(); ++s) {
    for (int64_t b = 0; b < blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      const int64_t in_bytes = in * h * w * c;
      h = (h + stride - 1) / stride;
      w = (w + stride - 1) / stride;
      const int64_t map = channels[s] * h * w * c;
      // bn1's input, relu's output (conv2's input), bn2's input, the last relu's output; the
      // projection shortcut's BatchNorm input. The block's input is the previous ReLU's.
      const bool shortcut = stride != 1 || in != channels[s];
      const int64_t outputs = channels[s] * h * w;
      // Its backward holds three gradient maps at once (of the output, of a BatchNorm's input
      // and of a convolution's input): the measured peaks of LibTorch 2.11's CPU kernels.
      out.push_back({in_bytes, (4 + (shortcut ? 1 : 0)) * map, 3 * map,
                     conv_flops(in, outputs, 3) + conv_flops(channels[s], outputs, 3) +
                         (shortcut ? conv_flops(in, outputs, 1) : 0.0)});
      in = channels[s];
    }
  }
  // Head: pooling takes the last ReLU's output (kept already); the Linear's input and logits;
  // log-softmax's fp32 output in the loss.
  out.push_back({in * h * w * c, in * c + num_classes * (c + 4), in * h * w * 4,
                 2.0 * static_cast<double>(in * num_classes)});
  return out;
}

std::shared_ptr<SegmentedModel> make_resnet(const ModelConfig& c, const std::vector<int64_t>& shape,
                                            int64_t num_classes) {
  if (shape.size() != 3)
    throw ConfigError(
        "model resnet needs image samples [channels, height, width]; the dataset "
        "gives " +
        std::to_string(shape.size()) + " dimensions");
  if (c.blocks.size() != c.channels.size())
    throw ConfigError("model.blocks must have one entry per stage of model.channels, got " +
                      std::to_string(c.blocks.size()) + " and " +
                      std::to_string(c.channels.size()));
  auto model = std::make_shared<SegmentedModel>();
  model->add_segment("stem", nn::Sequential(conv(shape[0], c.channels[0], 3, 1),
                                            nn::BatchNorm2d(c.channels[0]), nn::ReLU()));
  int64_t in = c.channels[0];
  for (size_t s = 0; s < c.channels.size(); ++s) {
    for (int64_t b = 0; b < c.blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      model->add_segment("stage" + std::to_string(s) + "_block" + std::to_string(b),
                         nn::Sequential(BasicBlock(in, c.channels[s], stride)));
      in = c.channels[s];
    }
  }
  model->add_segment(
      "head", nn::Sequential(nn::AdaptiveAvgPool2d(1), nn::Flatten(), nn::Linear(in, num_classes)));
  model->set_activation_estimate(
      [shape, channels = c.channels, blocks = c.blocks, num_classes](const ActivationDtypes& d) {
        return resnet_activations(shape, channels, blocks, num_classes, d);
      });
  return model;
}

}  // namespace

void register_resnet_model(Registry& registry) { registry.add_model("resnet", make_resnet); }

}  // namespace gpurun

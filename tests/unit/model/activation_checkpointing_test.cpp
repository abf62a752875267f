// Unit tests of activation checkpointing: cases 10 (dropout) and 11 (BatchNorm), DDP-free
// gradients bit-identical to plain backward, and the memory that checkpointing saves.
#include <ATen/ops/cross_entropy_loss.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "builtin.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "memory/meter.h"
#include "model/activation_checkpointing.h"
#include "model/precision.h"

namespace gpurun {
namespace {

namespace nn = torch::nn;

constexpr int64_t kMiB = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Activation checkpointing

TEST(Checkpointing, SetCheckpointedChecksTheNumberOfFlags) {
  SegmentedModel model;
  model.add_segment("a", nn::Sequential(nn::Linear(4, 4)));
  model.add_segment("b", nn::Sequential(nn::Linear(4, 2)));
  try {
    model.set_checkpointed({true, false, true});
    ADD_FAILURE() << "no std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("3 flags"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2 segments"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(model.checkpointed().empty());
  model.set_checkpointed({true, false});
  EXPECT_EQ(model.checkpointed(), (std::vector<bool>{true, false}));
  model.add_segment("c", nn::Sequential(nn::ReLU()));
  EXPECT_EQ(model.checkpointed(), (std::vector<bool>{true, false, false}));
  model.set_checkpointed({});
  EXPECT_TRUE(model.checkpointed().empty());
}

TEST(Checkpointing, EverySegmentOrNone) {
  SegmentedModel model;
  checkpoint_every_segment(model, true);  // no segments: nothing to checkpoint
  EXPECT_TRUE(model.checkpointed().empty());
  model.add_segment("a", nn::Sequential(nn::Linear(4, 4)));
  model.add_segment("b", nn::Sequential(nn::Linear(4, 2)));
  checkpoint_every_segment(model, true);
  EXPECT_EQ(model.checkpointed(), (std::vector<bool>{true, true}));
  checkpoint_every_segment(model, false);
  EXPECT_TRUE(model.checkpointed().empty());
}

/// Parameters and gradients of one training run, after every step.
struct Trace {
  std::vector<std::vector<at::Tensor>> grads, weights;
  std::vector<at::Tensor> buffers;  // after the last step
  at::Tensor rng_draw;              // torch::rand after the last step
};

/// `steps` SGD steps on random batches (seed 1) of shape `input_shape`; model made (seed 0)
/// by `make`, checkpointing every segment when `checkpoint`; the forward pass and loss under
/// `precision`'s autocast, as the trainer runs them.
template <typename Make>
Trace train(Make make, bool checkpoint, std::vector<int64_t> input_shape, int steps = 3,
            Precision precision = Precision::kFp32) {
  torch::manual_seed(0);
  std::shared_ptr<SegmentedModel> model = make();
  checkpoint_every_segment(*model, checkpoint);
  model->train();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::manual_seed(1);
  Trace trace;
  for (int s = 0; s < steps; ++s) {
    at::Tensor x = torch::randn(input_shape);
    at::Tensor y = torch::randint(10, {input_shape[0]});
    optimizer.zero_grad();
    at::Tensor loss;
    {
      AutocastGuard autocast(precision, c10::Device(c10::kCPU));
      loss = at::cross_entropy_loss(model->forward(x).to(at::kFloat), y);
    }
    loss.backward();
    std::vector<at::Tensor> g, w;
    for (const auto& p : model->parameters()) {
      g.push_back(p.grad().clone());
      w.push_back(p.detach().clone());
    }
    trace.grads.push_back(g);
    optimizer.step();
    trace.weights.push_back(w);
  }
  for (const auto& b : model->buffers()) trace.buffers.push_back(b.clone());
  trace.rng_draw = torch::rand({16});
  return trace;
}

void expect_identical(const Trace& plain, const Trace& checkpointed) {
  ASSERT_EQ(plain.grads.size(), checkpointed.grads.size());
  for (size_t s = 0; s < plain.grads.size(); ++s) {
    ASSERT_EQ(plain.grads[s].size(), checkpointed.grads[s].size());
    for (size_t i = 0; i < plain.grads[s].size(); ++i) {
      EXPECT_TRUE(torch::equal(plain.grads[s][i], checkpointed.grads[s][i]))
          << "gradient of parameter " << i << " at step " << s;
      EXPECT_TRUE(torch::equal(plain.weights[s][i], checkpointed.weights[s][i]))
          << "parameter " << i << " at step " << s;
      EXPECT_GT(plain.grads[s][i].abs().sum().item<double>(), 0.0);
    }
  }
  ASSERT_EQ(plain.buffers.size(), checkpointed.buffers.size());
  for (size_t i = 0; i < plain.buffers.size(); ++i)
    EXPECT_TRUE(torch::equal(plain.buffers[i], checkpointed.buffers[i])) << "buffer " << i;
  EXPECT_TRUE(torch::equal(plain.rng_draw, checkpointed.rng_draw)) << "RNG state afterwards";
}

// Case 10: dropout inside checkpointed segments (several layers per segment, so a second
// dropout mask after a recomputation's first one would differ).
TEST(Checkpointing, Case10_DropoutGivesIdenticalGradientsWeightsAndRng) {
  auto make = [] {
    auto model = std::make_shared<SegmentedModel>();
    model->add_segment("a", nn::Sequential(nn::Linear(32, 64), nn::ReLU(), nn::Dropout(0.5),
                                           nn::Linear(64, 64), nn::ReLU(), nn::Dropout(0.5)));
    model->add_segment("b", nn::Sequential(nn::Linear(64, 64), nn::ReLU(), nn::Dropout(0.5)));
    model->add_segment("head", nn::Sequential(nn::Linear(64, 10)));
    return model;
  };
  Trace plain = train(make, false, {16, 32});
  Trace checkpointed = train(make, true, {16, 32});
  expect_identical(plain, checkpointed);
}

TEST(Checkpointing, Case10_BuiltinMlpWithDropout) {
  Registry registry;
  register_builtin_plugins(registry);
  ModelConfig c;
  c.name = "mlp";
  c.hidden = {64, 32};
  c.dropout = 0.5;
  auto make = [&] { return registry.make_model(c, {1, 8, 8}, 10); };
  expect_identical(train(make, false, {16, 1, 8, 8}), train(make, true, {16, 1, 8, 8}));
}

// Case 11: BatchNorm statistics are updated once per step, not twice.
TEST(Checkpointing, Case11_BatchNormStatisticsUpdatedOnce) {
  auto make = [] {
    auto model = std::make_shared<SegmentedModel>();
    model->add_segment("conv1", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)),
                                               nn::BatchNorm2d(4), nn::ReLU()));
    model->add_segment("conv2", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(4, 4, 3).padding(1)),
                                               nn::BatchNorm2d(4), nn::ReLU(), nn::MaxPool2d(2)));
    model->add_segment("head", nn::Sequential(nn::Flatten(), nn::Linear(4 * 4 * 4, 10)));
    return model;
  };
  Trace plain = train(make, false, {8, 1, 8, 8});
  Trace checkpointed = train(make, true, {8, 1, 8, 8});
  expect_identical(plain, checkpointed);

  torch::manual_seed(0);
  auto model = make();
  model->set_checkpointed({true, true, false});
  model->train();
  for (int s = 0; s < 3; ++s)
    at::cross_entropy_loss(model->forward(torch::randn({8, 1, 8, 8})), torch::randint(10, {8}))
        .backward();
  int batch_norms = 0;
  for (const auto& b : model->named_buffers()) {
    if (b.key().find("num_batches_tracked") == std::string::npos) continue;
    EXPECT_EQ(b.value().item<int64_t>(), 3) << b.key();
    ++batch_norms;
  }
  EXPECT_EQ(batch_norms, 2);
}

/// A maker of the built-in CNN (BatchNorm, dropout) for images of side `side`.
std::function<std::shared_ptr<SegmentedModel>()> builtin_cnn(std::vector<int64_t> channels,
                                                             double dropout, int64_t side) {
  auto registry = std::make_shared<Registry>();
  register_builtin_plugins(*registry);
  ModelConfig c;
  c.name = "cnn";
  c.channels = std::move(channels);
  c.batch_norm = true;
  c.dropout = dropout;
  return [registry, c, side] { return registry->make_model(c, {1, side, side}, 10); };
}

TEST(Checkpointing, Case11_BuiltinCnnWithBatchNormAndDropout) {
  const auto make = builtin_cnn({4, 8}, 0.5, 8);
  expect_identical(train(make, false, {8, 1, 8, 8}), train(make, true, {8, 1, 8, 8}));
}

// Issue 45: on a CPU whose oneDNN computes bf16 (AVX512-BF16, AMX) and fp16 (AVX512-FP16,
// AMX-FP16) natively, the example's CNN at the micro-batch its plan takes under a memory limit
// (16 of 28 x 28 images, channels 32 and 64, BatchNorm, dropout): the checkpointed segments'
// first pass (grad mode off) and their recomputation (on) must run the same kernels. Runs on
// every CPU and is never skipped: where the units are emulated it holds trivially.
TEST(Checkpointing, SixteenBitAutocastGivesTheSameGradientsAsWithoutIt) {
  const auto make = builtin_cnn({32, 64}, 0.25, 28);
  for (const Precision precision : {Precision::kBf16, Precision::kFp16}) {
    SCOPED_TRACE(precision_name(precision));
    expect_identical(train(make, false, {16, 1, 28, 28}, 2, precision),
                     train(make, true, {16, 1, 28, 28}, 2, precision));
  }
}

TEST(Checkpointing, EvalModeAndNoGradRunPlainly) {
  torch::manual_seed(0);
  auto model = std::make_shared<SegmentedModel>();
  model->add_segment("a", nn::Sequential(nn::Linear(8, 8), nn::BatchNorm1d(8), nn::ReLU()));
  model->add_segment("head", nn::Sequential(nn::Linear(8, 3)));
  model->set_checkpointed({true, true});
  at::Tensor x = torch::randn({5, 8});

  model->eval();
  at::Tensor y = model->forward(x);
  EXPECT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name().find("CheckpointFunction"), std::string::npos);

  model->train();
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(model->forward(x).requires_grad());
  }
  at::Tensor z = model->forward(x);
  ASSERT_NE(z.grad_fn(), nullptr);
  EXPECT_NE(z.grad_fn()->name().find("CheckpointFunction"), std::string::npos)
      << z.grad_fn()->name();
}

TEST(Checkpointing, InputGradientFlowsThroughCheckpointedSegments) {
  torch::manual_seed(0);
  nn::Sequential segment(nn::Linear(6, 6), nn::Tanh(), nn::Linear(6, 6));
  at::Tensor x = torch::randn({4, 6}).requires_grad_(true);
  segment->forward(x).pow(2).sum().backward();
  at::Tensor expected_x = x.grad().clone();
  std::vector<at::Tensor> expected;
  for (const auto& p : segment->parameters()) expected.push_back(p.grad().clone());

  x.mutable_grad() = at::Tensor();
  for (auto& p : segment->parameters()) p.mutable_grad() = at::Tensor();
  checkpointed_forward(segment, x).pow(2).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), expected_x));
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_TRUE(torch::equal(segment->parameters()[i].grad(), expected[i])) << i;
}

/// Peak bytes of one forward and backward pass of `model` on `x` (cross-entropy on labels 0),
/// with the parameters' gradients unset before, as at the first step of a run.
int64_t step_peak(SegmentedModel& model, const at::Tensor& x) {
  model.zero_grad(/*set_to_none=*/true);
  at::Tensor y = at::zeros({x.size(0)}, at::kLong);
  auto meter = make_cpu_meter(0);
  at::cross_entropy_loss(model.forward(x), y).backward();
  return meter->peak_bytes();
}

// Chen et al. 2016: with k segments of depth d, the forward pass keeps k inputs and one
// segment's d activations instead of k * d activations.
TEST(Checkpointing, ReducesTheMeasuredPeakOfADeepMlp) {
  torch::manual_seed(0);
  SegmentedModel model;
  const int64_t width = 128, batch = 1024;
  for (int s = 0; s < 8; ++s) {
    nn::Sequential segment;
    for (int layer = 0; layer < 4; ++layer) {
      segment->push_back(nn::Linear(width, width));
      segment->push_back(nn::ReLU());
    }
    model.add_segment("block" + std::to_string(s), segment);
  }
  model.add_segment("head", nn::Sequential(nn::Linear(width, 10)));
  model.train();
  at::Tensor x = torch::randn({batch, width});

  const int64_t plain = step_peak(model, x);
  model.set_checkpointed({true, true, true, true, true, true, true, true, false});
  const int64_t checkpointed = step_peak(model, x);
  std::printf(
      "[          ] 8 segments x 4 (Linear %lld + ReLU), batch %lld: peak %.2f MiB plain, "
      "%.2f MiB checkpointed (%.2f)\n",
      static_cast<long long>(width), static_cast<long long>(batch),
      static_cast<double>(plain) / kMiB, static_cast<double>(checkpointed) / kMiB,
      static_cast<double>(checkpointed) / static_cast<double>(plain));
  EXPECT_LT(static_cast<double>(checkpointed), 0.8 * static_cast<double>(plain));
}

// The built-in mlp has one Linear + ReLU (+ Dropout) per segment, so checkpointing it saves
// only what lies between a segment's input and its output: the pre-activation and the
// dropout mask. Measured and reported, and never worse than plain.
TEST(Checkpointing, BuiltinMlpPeak) {
  Registry registry;
  register_builtin_plugins(registry);
  ModelConfig c;
  c.name = "mlp";
  c.hidden = {512, 512, 512, 512};
  c.dropout = 0.2;
  torch::manual_seed(0);
  auto model = registry.make_model(c, {1, 28, 28}, 10);
  model->train();
  at::Tensor x = torch::randn({256, 1, 28, 28});
  const int64_t plain = step_peak(*model, x);
  model->set_checkpointed({true, true, true, true, false});
  const int64_t checkpointed = step_peak(*model, x);
  std::printf(
      "[          ] builtin mlp 784-512x4-10, dropout 0.2, batch 256: peak %.2f MiB "
      "plain, %.2f MiB checkpointed (%.2f)\n",
      static_cast<double>(plain) / kMiB, static_cast<double>(checkpointed) / kMiB,
      static_cast<double>(checkpointed) / static_cast<double>(plain));
  EXPECT_LT(checkpointed, plain);
}

}  // namespace
}  // namespace gpurun

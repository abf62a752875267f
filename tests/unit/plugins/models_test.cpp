// Tests of the built-in models resnet and gpt (plugins/), the loss of any rank (loss.h), and
// the registry's losses and epoch hooks.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <limits>

#include <gtest/gtest.h>

#include "builtin.h"
#include "gpurun/errors.h"
#include "gpurun/loss.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "model/activation_checkpointing.h"
#include "model/precision.h"

namespace gpurun {
namespace {

std::shared_ptr<SegmentedModel> make(const ModelConfig& c, std::vector<int64_t> shape,
                                     int64_t classes) {
  Registry registry;
  register_builtin_plugins(registry);
  torch::manual_seed(0);
  return registry.make_model(c, shape, classes);
}

ModelConfig resnet_config() {
  ModelConfig c;
  c.name = "resnet";
  c.channels = {8, 16};
  c.blocks = {2, 1};
  return c;
}

ModelConfig gpt_config(double dropout = 0.0) {
  ModelConfig c;
  c.name = "gpt";
  c.layers = 2;
  c.heads = 2;
  c.width = 16;
  c.dropout = dropout;
  return c;
}

TEST(Resnet, LogitsForMnistAndCifarShapesWithOneSegmentPerBlock) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 28, 28}, {3, 32, 32}}) {
    auto model = make(resnet_config(), shape, 10);
    EXPECT_EQ(model->segment_names(),
              (std::vector<std::string>{"stem", "stage0_block0", "stage0_block1", "stage1_block0",
                                        "head"}));
    std::vector<int64_t> batch{4};
    batch.insert(batch.end(), shape.begin(), shape.end());
    EXPECT_EQ(model->forward(torch::randn(batch)).sizes(), (std::vector<int64_t>{4, 10}));
  }
  // The stage change has a projection shortcut; a block of equal width and stride has none.
  auto model = make(resnet_config(), {1, 28, 28}, 10);
  bool projection = false, identity_has_one = false;
  for (const auto& p : model->named_parameters()) {
    projection |= p.key().find("stage1_block0.0.shortcut") == 0;
    identity_has_one |= p.key().find("stage0_block1.0.shortcut") == 0;
  }
  EXPECT_TRUE(projection);
  EXPECT_FALSE(identity_has_one);
}

/// Gradients of one SGD step with every segment checkpointed or none, and the buffers after.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> one_step(
    std::shared_ptr<SegmentedModel> model, bool checkpoint, const at::Tensor& x,
    const at::Tensor& y) {
  checkpoint_every_segment(*model, checkpoint);
  model->train();
  torch::manual_seed(7);  // dropout masks
  cross_entropy(model->forward(x), y).backward();
  std::vector<at::Tensor> grads, buffers;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
  for (const auto& b : model->buffers()) buffers.push_back(b.clone());
  return {grads, buffers};
}

void expect_bit_identical(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                          const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << what << " " << i;
}

TEST(Resnet, CheckpointingGivesBitIdenticalGradientsAndBatchNormStatistics) {
  const at::Tensor x = torch::randn({6, 1, 28, 28}), y = torch::randint(10, {6});
  auto plain = one_step(make(resnet_config(), {1, 28, 28}, 10), false, x, y);
  auto checkpointed = one_step(make(resnet_config(), {1, 28, 28}, 10), true, x, y);
  expect_bit_identical(plain.first, checkpointed.first, "gradient");
  expect_bit_identical(plain.second, checkpointed.second, "buffer");
  EXPECT_GT(plain.first.front().abs().sum().item<double>(), 0.0);
}

TEST(Gpt, LogitsPerPositionWithOneSegmentPerBlock) {
  auto model = make(gpt_config(), {12}, 30);
  EXPECT_EQ(model->segment_names(),
            (std::vector<std::string>{"embed", "block0", "block1", "head"}));
  const at::Tensor ids = torch::randint(30, {3, 12});
  EXPECT_EQ(model->forward(ids).sizes(), (std::vector<int64_t>{3, 12, 30}));
  // Shorter sequences (generation) work; longer than the context are refused.
  EXPECT_EQ(model->forward(ids.narrow(1, 0, 5)).sizes(), (std::vector<int64_t>{3, 5, 30}));
  EXPECT_THROW(model->forward(torch::randint(30, {1, 13})), c10::Error);
  // model.context sets the positions; a context shorter than the data's is refused.
  ModelConfig longer = gpt_config();
  longer.context = 20;
  EXPECT_EQ(make(longer, {12}, 30)->forward(torch::randint(30, {1, 20})).size(1), 20);
  longer.context = 8;
  EXPECT_THROW(make(longer, {12}, 30), ConfigError);
  ModelConfig odd = gpt_config();
  odd.heads = 3;
  EXPECT_THROW(make(odd, {12}, 30), ConfigError);
  EXPECT_THROW(make(gpt_config(), {1, 28, 28}, 10), ConfigError);
}

// The activation estimate follows the forward pass op by op (plugins/gpt.cpp); these pin its
// terms per token of a block (w width, H heads, T time, c the product dtype's bytes).
TEST(Gpt, ActivationEstimatePinsWhatEachBlockKeepsForBackward) {
  ModelConfig c = gpt_config(0.1);  // w 16, H 2, 2 blocks
  auto model = make(c, {12}, 30);
  ASSERT_TRUE(model->activation_estimate());
  const int64_t w = 16, h = 2, t = 12;
  // CPU bf16 with attention dropout, ATen's math path: LayerNorms 2 x (4w + 8), the products'
  // inputs 2w + 2w + 2w + 8w, qkv 6w, GELU's input 8w, two residual masks 2 x 2w; the math
  // path in fp32: q, k and v 3 x 4w, softmax's output, dropout's mask and output 3 x 4 x H T.
  const auto bf16 = model->activation_estimate()({2, false});
  ASSERT_EQ(bf16.size(), 4u);  // embed, block0, block1, head
  EXPECT_EQ(bf16[1].saved_bytes, t * (2 * (4 * w + 8) + 32 * w + 12 * w + 12 * h * t));
  EXPECT_EQ(bf16[1].input_bytes, t * 4 * w);
  // CUDA fp32 without dropout, the fused kernel: no scores, the log-sum-exp (fp32, H a token).
  c.dropout = 0;
  const auto cuda = make(c, {12}, 30)->activation_estimate()({4, true});
  EXPECT_EQ(cuda[1].saved_bytes,
            t * (2 * (4 * w + 8) + 4 * (w + w + 3 * w + w + 4 * w + 4 * w) + 4 * h));
  // A CPU without dropout runs ATen's flash kernel: the same, in bf16 under autocast.
  const auto cpu = make(c, {12}, 30)->activation_estimate()({2, false});
  EXPECT_EQ(cpu[1].saved_bytes,
            t * (2 * (4 * w + 8) + 2 * (w + w + 3 * w + w + 4 * w + 4 * w) + 4 * h));
  // With dropout on CUDA the fused kernels keep no mask of the scores (they redraw it).
  c.dropout = 0.1;
  const auto cuda_dropout = make(c, {12}, 30)->activation_estimate()({2, true});
  EXPECT_EQ(cuda_dropout[1].saved_bytes,
            t * (2 * (4 * w + 8) + 2 * (w + w + 3 * w + w + 4 * w + 4 * w) + 2 * w + 4 * h));
  // FLOPs per block: 2 x 12 w^2 per token for the products of width, 2 x 2 T w for the scores.
  EXPECT_DOUBLE_EQ(cuda[1].forward_flops, t * (24.0 * w * w + 4.0 * t * w));
}

TEST(Gpt, CausalMaskKeepsEarlierPositionsBlindToLaterTokens) {
  auto model = make(gpt_config(), {16}, 20);
  model->eval();
  torch::NoGradGuard no_grad;
  at::Tensor ids = torch::randint(20, {2, 16});
  at::Tensor changed = ids.clone();
  const int64_t t = 9;
  changed.select(1, t).add_(1).remainder_(20);
  const at::Tensor a = model->forward(ids), b = model->forward(changed);
  EXPECT_TRUE(at::equal(a.narrow(1, 0, t), b.narrow(1, 0, t))) << "positions before " << t;
  for (int64_t p = t; p < 16; ++p)
    EXPECT_FALSE(at::equal(a.select(1, p), b.select(1, p))) << "position " << p;
}

// Issue 40, item 3: the fused attention (ATen's flash kernel on a CPU) computes what
// softmax(Q K^T / sqrt(d)) V with the future masked did, within float rounding, and its
// backward pass is deterministic: two steps give bit-identical gradients at 4 threads (an exact
// resume needs it), in fp32 and under bf16 autocast, with and without attention dropout (ATen's
// math path, whose masks come from the seeded generator).
TEST(Gpt, FusedAttentionMatchesTheScoresFormulaAndIsDeterministic) {
  const int threads = at::get_num_threads();
  at::set_num_threads(4);
  ModelConfig c = gpt_config();
  c.width = 64;
  c.heads = 4;
  auto model = make(c, {48}, 40);
  const at::Tensor x = torch::randint(40, {3, 48}), y = torch::randint(40, {3, 48});
  // The scores formula over the same weights: the whole forward pass of a one-block gpt, by
  // hand, with the attention as the gpt computed it before.
  {
    torch::NoGradGuard no_grad;
    ModelConfig one = c;
    one.layers = 1;
    auto m = make(one, {48}, 40);
    m->eval();
    const auto p = m->named_parameters();
    const auto norm = [&](const at::Tensor& t, const std::string& name) {
      return at::layer_norm(t, {64}, p[name + ".weight"], p[name + ".bias"]);
    };
    const auto linear = [&](const at::Tensor& t, const std::string& name) {
      return at::linear(t, p[name + ".weight"],
                        p.contains(name + ".bias") ? p[name + ".bias"] : at::Tensor());
    };
    at::Tensor h = at::embedding(p["embed.0.tokens.weight"], x) +
                   at::embedding(p["embed.0.positions.weight"], at::arange(48));
    const at::Tensor qkv = linear(norm(h, "block0.0.norm1"), "block0.0.attention.qkv")
                               .view({3, 48, 3, 4, 16})
                               .permute({2, 0, 3, 1, 4});
    at::Tensor scores = at::matmul(qkv[0], qkv[1].transpose(-2, -1)) / 4.0;
    scores.masked_fill_(at::ones({48, 48}, at::kBool).triu_(1),
                        -std::numeric_limits<float>::infinity());
    const at::Tensor attention =
        at::matmul(scores.softmax(-1), qkv[2]).transpose(1, 2).reshape({3, 48, 64});
    h = h + linear(attention, "block0.0.attention.projection");
    h = h +
        linear(at::gelu(linear(norm(h, "block0.0.norm2"), "block0.0.expand")), "block0.0.contract");
    const at::Tensor logits = linear(norm(h, "head.0"), "head.1");
    const at::Tensor fused = m->forward(x);
    EXPECT_LT((fused - logits).abs().max().item<double>(), 1e-5);
  }
  for (const Precision precision : {Precision::kFp32, Precision::kBf16})
    for (const double dropout : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(precision_name(precision)) + " dropout " + std::to_string(dropout));
      c.dropout = dropout;
      const auto grads = [&] {
        auto m = make(c, {48}, 40);
        m->train();
        torch::manual_seed(7);
        {
          AutocastGuard autocast(precision, c10::kCPU);
          const at::Tensor loss = cross_entropy(m->forward(x), y);
          loss.backward();
        }
        std::vector<at::Tensor> out;
        for (const auto& p : m->parameters()) out.push_back(p.grad().clone());
        return out;
      };
      torch::manual_seed(1);
      const auto a = grads();
      torch::manual_seed(1);
      const auto b = grads();
      expect_bit_identical(a, b, "gradient");
    }
  at::set_num_threads(threads);
}

TEST(Gpt, CheckpointingGivesBitIdenticalGradientsWithDropout) {
  const at::Tensor x = torch::randint(25, {4, 10}), y = torch::randint(25, {4, 10});
  auto plain = one_step(make(gpt_config(0.2), {10}, 25), false, x, y);
  auto checkpointed = one_step(make(gpt_config(0.2), {10}, 25), true, x, y);
  expect_bit_identical(plain.first, checkpointed.first, "gradient");
  for (const auto& g : plain.first) EXPECT_GT(g.abs().sum().item<double>(), 0.0);
}

TEST(Loss, CrossEntropyAndAccuracyOverEveryPosition) {
  const at::Tensor logits = torch::randn({3, 5, 7}), targets = torch::randint(7, {3, 5});
  const at::Tensor flat = at::cross_entropy_loss(logits.reshape({15, 7}), targets.reshape({15}));
  EXPECT_TRUE(at::equal(cross_entropy(logits, targets), flat));
  EXPECT_TRUE(at::equal(cross_entropy(logits[0], targets[0]),
                        at::cross_entropy_loss(logits[0], targets[0])));
  EXPECT_EQ(correct_predictions(logits, logits.argmax(-1)), 15);
  EXPECT_EQ(correct_predictions(logits, targets),
            logits.argmax(-1).eq(targets).sum().item<int64_t>());
  EXPECT_THROW(cross_entropy(logits, targets.narrow(1, 0, 4)), c10::Error);
}

TEST(Registry, LossesByNameAndEpochHooksLeaveTrainingUntouched) {
  Registry registry;
  EXPECT_EQ(registry.loss_names(), std::vector<std::string>{"cross_entropy"});
  EXPECT_THROW(registry.make_loss("hinge"), ConfigError);
  registry.add_loss(
      "double", [](const at::Tensor& l, const at::Tensor& t) { return cross_entropy(l, t) * 2; });
  EXPECT_THROW(registry.add_loss("double", cross_entropy), std::logic_error);

  auto model = make(gpt_config(), {8}, 10);
  model->train();
  bool ran = false, eval_mode = false, no_grad = false;
  registry.add_epoch_hook("a_draws", [&](const EpochEnd& e) {
    ran = true;
    eval_mode = !e.model.is_training();
    no_grad = !c10::GradMode::is_enabled();
    torch::randn({100});  // must not move the training RNG
  });
  registry.add_epoch_hook("b_throws", [](const EpochEnd&) { throw std::runtime_error("boom"); });
  RunConfig config;
  DatasetSplits data;
  torch::manual_seed(3);
  const at::Tensor expected = torch::randn({4});
  torch::manual_seed(3);
  registry.run_epoch_hooks({config, *model, data, c10::kCPU, 0, 10});  // b_throws is logged
  EXPECT_TRUE(ran && eval_mode && no_grad);
  EXPECT_TRUE(model->is_training());
  EXPECT_TRUE(at::equal(torch::randn({4}), expected)) << "the global RNG moved";
}

TEST(Registry, StepHooksSeeEveryStepInNameOrderAndAThrowingOneIsContained) {
  Registry registry;
  std::vector<std::string> calls;
  registry.add_step_hook(
      "b", [&](const StepEnd& e) { calls.push_back("b" + std::to_string(e.global_step)); });
  registry.add_step_hook("a", [&](const StepEnd& e) {
    calls.push_back("a" + std::to_string(e.global_step));
    throw std::runtime_error("tracker offline");
  });
  EXPECT_THROW(registry.add_step_hook("a", [](const StepEnd&) {}), std::logic_error);
  RunConfig config;
  for (int64_t step = 1; step <= 2; ++step) registry.run_step_hooks({config, 0, 0, step, 0.5, 0.1});
  EXPECT_EQ(calls, (std::vector<std::string>{"a1", "b1", "a2", "b2"}));
}

}  // namespace
}  // namespace gpurun

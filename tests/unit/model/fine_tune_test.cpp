// Unit tests of model/fine_tune.h (frozen parameters, LoRA) and train/init_weights.h on the
// built-in gpt and mlp (issue 12).
#include <ATen/ops/randint.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <gtest/gtest.h>

#include "builtin.h"
#include "checkpoint/format/pickle.h"
#include "common/log_capture.h"
#include "common/temp_dir.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "model/activation_checkpointing.h"
#include "model/fine_tune.h"
#include "train/init_weights.h"
#include "util/fs.h"

namespace gpurun {
namespace {

using test::TempDir;

constexpr int64_t kVocabulary = 40, kContext = 16;

std::shared_ptr<SegmentedModel> gpt(double dropout = 0.0, uint64_t seed = 3) {
  Registry registry;
  register_builtin_plugins(registry);
  ModelConfig c;
  c.name = "gpt";
  c.layers = 2;
  c.heads = 2;
  c.width = 32;
  c.dropout = dropout;
  torch::manual_seed(seed);
  return registry.make_model(c, {kContext}, kVocabulary);
}

LoraConfig lora(int64_t rank = 4,
                std::vector<std::string> targets = {"*.attention.*", "*.expand", "*.contract"}) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = 8;
  l.targets = std::move(targets);
  return l;
}

at::Tensor ids() {
  torch::manual_seed(11);
  return at::randint(kVocabulary, {3, kContext}, at::kLong);
}

TEST(FineTune, PatternsCrossDotsAsFnmatch) {
  EXPECT_TRUE(name_matches("block0.*", "block0.0.attention.qkv.weight"));
  EXPECT_TRUE(name_matches("*.bias", "head.1.bias"));
  EXPECT_TRUE(name_matches("block?.0.norm1.*", "block1.0.norm1.weight"));
  EXPECT_FALSE(name_matches("block0.*", "block10.0.norm1.weight"));
  EXPECT_FALSE(name_matches("embed", "embed.0.tokens.weight"));
}

TEST(FineTune, FreezeCountsOnlyWhatStaysTrainableAndNamesAPatternThatMatchesNothing) {
  auto model = gpt();
  const ParameterCounts before = count_parameters(*model);
  EXPECT_EQ(before.trainable, before.total);
  int64_t embed = 0;
  for (const auto& p : model->named_parameters())
    if (p.key().rfind("embed.", 0) == 0) embed += p.value().numel();
  EXPECT_GT(freeze_parameters(*model, {"embed.*"}), 0);
  const ParameterCounts after = count_parameters(*model);
  EXPECT_EQ(after.total, before.total);
  EXPECT_EQ(after.trainable, before.total - embed);
  EXPECT_EQ(static_cast<int64_t>(trainable_parameters(*model).size()),
            static_cast<int64_t>(model->parameters().size()) - 2);  // tokens, positions
  try {
    freeze_parameters(*model, {"blok0.*"});
    FAIL() << "a pattern that matches nothing must be an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"blok0.*\" matches no parameter"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("embed.0.tokens.weight"), std::string::npos) << e.what();
  }
}

TEST(FineTune, LoraStartsAtTheBaseModelTrainsOnlyTheAdaptersAndMergesToTheSameLogits) {
  auto base = gpt(), adapted = gpt();
  const std::vector<std::string> layers = add_lora_adapters(*adapted, lora());
  EXPECT_EQ(layers.size(), 8u);  // qkv, projection, expand, contract in each of 2 blocks
  EXPECT_EQ(layers.front(), "block0.0.attention.qkv");
  const at::Tensor x = ids();
  // B = 0: the adapted model starts as the base model, bit for bit.
  EXPECT_TRUE(at::equal(adapted->forward(x), base->forward(x)));
  for (const auto& p : adapted->named_parameters()) {
    const bool adapter = p.key().find(".lora_") != std::string::npos;
    EXPECT_EQ(p.value().requires_grad(), adapter) << p.key();
  }
  // Train the adapters a little so that B A is not zero.
  std::vector<at::Tensor> params = trainable_parameters(*adapted);
  for (int step = 0; step < 3; ++step) {
    adapted->forward(x).square().mean().backward();
    torch::NoGradGuard no_grad;
    for (auto& p : params) {
      p.sub_(p.grad() * 0.5);
      p.mutable_grad() = at::Tensor();
    }
  }
  const at::Tensor logits = adapted->forward(x);
  EXPECT_FALSE(at::allclose(logits, base->forward(x)));
  // The merged state_dict loads strictly into the base architecture and gives its logits.
  const auto merged = merge_lora_adapters(state_dict(*adapted), 8.0 / 4);
  EXPECT_EQ(merged.size(), state_dict(*base).size());
  TempDir dir;
  fs::replace_file(dir / "merged.pt", pickle_tensors(merged));
  const InitialWeights init = load_initial_weights(*base, dir / "merged.pt", /*strict=*/true);
  EXPECT_EQ(init.loaded, static_cast<int64_t>(merged.size()));
  EXPECT_TRUE(at::allclose(base->forward(x), logits, 1e-5, 1e-5));
}

TEST(FineTune, LoraGradientsAreTheSameWithActivationCheckpointingDropoutIncluded) {
  LoraConfig l = lora();
  l.dropout = 0.2;
  std::vector<std::vector<at::Tensor>> grads;
  for (const bool checkpointing : {false, true}) {
    auto model = gpt(/*dropout=*/0.1);
    add_lora_adapters(*model, l);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->named_parameters())  // B != 0, so that A gets a gradient too
        if (p.key().find(".lora_B") != std::string::npos) p.value().fill_(0.01);
    }
    checkpoint_every_segment(*model, checkpointing);
    torch::manual_seed(5);
    model->forward(ids()).square().mean().backward();
    std::vector<at::Tensor> g;
    for (const auto& p : trainable_parameters(*model)) g.push_back(p.grad().clone());
    grads.push_back(g);
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(at::equal(grads[0][i], grads[1][i]))
        << "parameter " << i << " differs by "
        << (grads[0][i] - grads[1][i]).abs().max().item<double>() << " of "
        << grads[0][i].abs().max().item<double>();
    EXPECT_GT(grads[0][i].abs().sum().item<double>(), 0) << "parameter " << i;
  }
}

// Issue 31, item 8: a rank at or above a layer's min(in, out) makes LoRA train as much as the
// layer itself; that is said, once, naming the layers.
TEST(FineTune, LoraWarnsOfARankNotBelowTheLayersWidth) {
  {
    test::LogCapture log;
    add_lora_adapters(*gpt(), lora(4));
    EXPECT_EQ(log.text().find("is not below min(in, out)"), std::string::npos) << log.text();
  }
  test::LogCapture log;
  add_lora_adapters(*gpt(), lora(32, {"*.attention.*"}));  // width 32: every layer
  const std::string said = log.text();
  EXPECT_NE(said.find("model.lora.rank 32 is not below min(in, out) of 4 of the 4 adapted"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("block0.0.attention.qkv (96 x 32)"), std::string::npos) << said;
}

TEST(FineTune, LoraNamesTheLinearLayersWhenNoTargetMatches) {
  auto model = gpt();
  try {
    add_lora_adapters(*model, lora(4, {"*.attention.*", "*.attn.*"}));
    FAIL() << "a target that matches nothing must be an error, even beside one that does";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"*.attn.*\" matches no Linear layer"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("block0.0.attention.qkv"), std::string::npos) << e.what();
  }
}

TEST(InitWeights, StrictNamesEveryMismatchAndLeavesTheModelAsItWas) {
  TempDir dir;
  auto source = gpt(0.0, /*seed=*/1);
  auto state = state_dict(*source);
  state.erase(state.begin() + 1);                      // one missing
  state.emplace_back("extra.weight", at::zeros({2}));  // one unexpected
  state[0].second = at::zeros({kVocabulary + 1, 32});  // one of another shape
  fs::replace_file(dir / "w.pt", pickle_tensors(state));
  auto model = gpt(0.0, /*seed=*/2);
  const std::string digest = model_digest(*model);
  try {
    load_initial_weights(*model, dir / "w.pt", /*strict=*/true);
    FAIL() << "strict loading must refuse the file";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("embed.0.tokens.weight: the file has [41, 32], the model [40, 32]"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("embed.0.positions.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("extra.weight"), std::string::npos) << m;
  }
  EXPECT_EQ(model_digest(*model), digest);
  const InitialWeights loose = load_initial_weights(*model, dir / "w.pt", /*strict=*/false);
  EXPECT_EQ(loose.not_loaded.size(), 2u);
  EXPECT_EQ(loose.unused.size(), 1u);
  EXPECT_EQ(loose.loaded, static_cast<int64_t>(state_dict(*model).size()) - 2);
  EXPECT_NE(model_digest(*model), digest);
  EXPECT_THROW(load_initial_weights(*model, dir / "missing.pt", true), ConfigError);
  // Not a torch.save file: one line, no C++ backtrace.
  fs::replace_file(dir / "text.pt", "hello\n");
  try {
    load_initial_weights(*model, dir / "text.pt", false);
    FAIL() << "a text file is not a state_dict";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not a state_dict"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("frame #"), std::string::npos) << e.what();
  }
  // Nothing that matches is an error even when not strict (a DDP save's "module." names).
  NamedTensors prefixed;
  for (const auto& [name, tensor] : state_dict(*source))
    prefixed.emplace_back("module." + name, tensor);
  fs::replace_file(dir / "ddp.pt", pickle_tensors(prefixed));
  try {
    load_initial_weights(*model, dir / "ddp.pt", false);
    FAIL() << "a file of which nothing matches must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the file's like module.embed.0.tokens.weight"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace gpurun

// Unit tests of the `hf` model (plugins/llama.cpp) and model/hf_config.h: transformers' names,
// exact parameter counts of grouped-query attention and SwiGLU (Llama-2-7B's and Llama-3-8B's
// published configs built without their weights), tied embeddings under activation
// checkpointing, LoRA on "*.q_proj", and config.json's errors (issue 41).
#include <ATen/ops/randint.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <gtest/gtest.h>

#include "builtin.h"
#include "checkpoint/format/safetensors.h"
#include "common/temp_dir.h"
#include "gpurun/errors.h"
#include "gpurun/loss.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "model/activation_checkpointing.h"
#include "model/fine_tune.h"
#include "model/hf_config.h"
#include "model/without_weights.h"
#include "train/hf_weights.h"
#include "util/fs.h"

namespace gpurun {
namespace {

using test::TempDir;

const char* kTiny = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 32,
  "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-5, "hidden_act": "silu",
  "max_position_embeddings": 64, "tie_word_embeddings": TIE, "torch_dtype": "float32"})";

std::string tiny(bool tied, const std::string& arch = "LlamaForCausalLM") {
  std::string s = kTiny;
  s.replace(s.find("TIE"), 3, tied ? "true" : "false");
  s.replace(s.find("LlamaForCausalLM"), 16, arch);
  return s;
}

std::shared_ptr<SegmentedModel> build(const TempDir& dir, const std::string& config_json,
                                      int64_t context = 8) {
  fs::replace_file(dir / "config.json", config_json);
  Registry registry;
  register_builtin_plugins(registry);
  ModelConfig c;
  c.name = "hf";
  c.path = dir.path();
  torch::manual_seed(1);
  return registry.make_model(c, {context}, 64);
}

std::vector<std::string> names(const torch::nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : state_dict(model)) out.push_back(name);
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(HfModel, StateDictKeysAreTransformersNames) {
  TempDir dir;
  const auto untied = names(*build(dir, tiny(false)));
  for (const char* key :
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight", "model.layers.1.mlp.gate_proj.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.norm.weight", "lm_head.weight"})
    EXPECT_TRUE(has(untied, key)) << key;
  EXPECT_FALSE(has(untied, "model.layers.0.self_attn.q_proj.bias"));
  // Tied: one tensor, saved once under the embedding's name, as save_pretrained writes it.
  const auto tied = names(*build(dir, tiny(true)));
  EXPECT_FALSE(has(tied, "lm_head.weight"));
  EXPECT_EQ(tied.size(), untied.size() - 1);
  // Qwen2: q, k and v have biases, o_proj none.
  const auto qwen = names(*build(dir, tiny(false, "Qwen2ForCausalLM")));
  EXPECT_TRUE(has(qwen, "model.layers.0.self_attn.q_proj.bias"));
  EXPECT_TRUE(has(qwen, "model.layers.0.self_attn.v_proj.bias"));
  EXPECT_FALSE(has(qwen, "model.layers.0.self_attn.o_proj.bias"));
}

/// Parameters of a Llama config: embedding, per layer q/k/v/o, gate/up/down and two norms,
/// the final norm, and an untied head.
int64_t llama_parameters(int64_t v, int64_t h, int64_t inner, int64_t layers, int64_t heads,
                         int64_t kv) {
  const int64_t d = h / heads;
  const int64_t layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * inner + 2 * h;
  return v * h + layers * layer + h + v * h;
}

TEST(HfModel, PublishedLlamaConfigsCountGroupedQueryAttentionAndSwigluExactly) {
  TempDir dir;
  // Llama-2-7B's config.json (meta-llama/Llama-2-7b-hf): 6,738,415,616 parameters.
  const std::string llama2 = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 32, "vocab_size": 32000, "rms_norm_eps": 1e-05,
    "hidden_act": "silu", "max_position_embeddings": 4096, "rope_theta": 10000.0,
    "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16"})";
  // Llama-3-8B / 3.1-8B's: 8 key/value heads, vocab 128256, rope_scaling llama3.
  const std::string llama3 = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-05, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
    "rope_type": "llama3"}, "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";
  WithoutWeights without;  // a 7B model costs address space, not memory
  EXPECT_EQ(count_parameters(*build(dir, llama2, 16)).total, 6'738'415'616);
  EXPECT_EQ(count_parameters(*build(dir, llama2, 16)).total,
            llama_parameters(32000, 4096, 11008, 32, 32, 32));
  EXPECT_EQ(count_parameters(*build(dir, llama3, 16)).total, 8'030'261'248);
}

TEST(HfModel, AFolderWithWeightsBuildsRealTensorsThatTheLoadFillsExactly) {
  TempDir dir;
  const auto source = build(dir, tiny(true));  // no weights yet: initialised
  const auto state = state_dict(*source);
  std::vector<SafetensorsSpec> specs;
  for (const auto& [name, t] : state) specs.push_back({name, at::kBFloat16, t.sizes().vec()});
  write_safetensors(dir / "model.safetensors", specs,
                    [&](size_t i) { return state[i].second.to(at::kBFloat16); });
  const auto model = build(dir, tiny(true));
  for (const auto& [name, t] : state_dict(*model)) {
    EXPECT_TRUE(t.device().is_cpu()) << name << " " << t.device();
    EXPECT_FALSE(t.key_set().has(c10::DispatchKey::Meta)) << name;
  }
  check_hf_weights(*model, dir.path());
  const auto record = load_hf_weights(*model, dir.path());
  EXPECT_EQ(record["dtype"], "bfloat16");
  EXPECT_EQ(record["loaded"], static_cast<int64_t>(state.size()));
  const auto loaded = state_dict(*model);
  for (size_t i = 0; i < state.size(); ++i)
    EXPECT_TRUE(at::equal(loaded[i].second, state[i].second.to(at::kBFloat16).to(at::kFloat)))
        << state[i].first;
  // The model runs on them.
  const at::Tensor logits = model->forward(at::randint(64, {2, 8}));
  EXPECT_TRUE(logits.isfinite().all().item<bool>());
}

TEST(HfModel, TiedEmbeddingsGetTheSameGradientWithActivationCheckpointing) {
  TempDir dir;
  for (bool tied : {true, false}) {
    std::vector<at::Tensor> grads[2];
    for (int checkpointing = 0; checkpointing < 2; ++checkpointing) {
      auto model = build(dir, tiny(tied));
      checkpoint_every_segment(*model, checkpointing == 1);
      torch::manual_seed(5);
      const at::Tensor ids = at::randint(64, {3, 8});
      const at::Tensor targets = at::randint(64, {3, 8});
      cross_entropy(model->forward(ids), targets).backward();
      for (const auto& p : model->parameters()) grads[checkpointing].push_back(p.grad().clone());
    }
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_TRUE(at::allclose(grads[0][i], grads[1][i], 1e-5, 1e-6))
          << "tied " << tied << " " << i;
  }
}

TEST(HfModel, LoraTargetsTakeTransformersNames) {
  TempDir dir;
  auto model = build(dir, tiny(false));
  LoraConfig lora;
  lora.rank = 2;
  lora.targets = {"*.q_proj", "*.v_proj"};
  const auto adapted = add_lora_adapters(*model, lora);
  ASSERT_EQ(adapted.size(), 4u);
  EXPECT_EQ(adapted[0], "model.layers.0.self_attn.q_proj");
  const auto keys = names(*model);
  EXPECT_TRUE(has(keys, "model.layers.1.self_attn.v_proj.lora_A"));
  EXPECT_TRUE(has(keys, "model.layers.1.self_attn.v_proj.lora_B"));
  EXPECT_EQ(named_trainable_parameters(*model).size(), 8u);
  // The adapters act in their segments' prologues: a forward pass trains them.
  const at::Tensor ids = at::randint(64, {2, 8});
  cross_entropy(model->forward(ids), at::randint(64, {2, 8})).backward();
  for (const auto& [name, p] : named_trainable_parameters(*model))
    EXPECT_TRUE(p.grad().defined()) << name;
}

TEST(HfConfig, UnsupportedArchitecturesAndRopeTypesAreRefusedNamingTheKey) {
  const auto refusal = [](const std::string& text) {
    try {
      parse_hf_config(text, "DIR/config.json");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string gpt2 = tiny(false, "GPT2LMHeadModel");
  std::string message = refusal(gpt2);
  EXPECT_NE(message.find("DIR/config.json: architectures"), std::string::npos) << message;
  EXPECT_NE(message.find("LlamaForCausalLM"), std::string::npos) << message;
  std::string yarn = tiny(false);
  yarn.insert(1, R"("rope_scaling": {"rope_type": "yarn", "factor": 4},)");
  message = refusal(yarn);
  EXPECT_NE(message.find("rope_scaling.rope_type"), std::string::npos) << message;
  EXPECT_NE(message.find("llama3"), std::string::npos) << message;
  std::string gelu = tiny(false);
  gelu.replace(gelu.find("\"silu\""), 6, "\"gelu\"");
  EXPECT_NE(refusal(gelu).find("hidden_act"), std::string::npos);
  std::string odd = tiny(false);
  odd.replace(odd.find("\"num_key_value_heads\": 2"), 24, "\"num_key_value_heads\": 3");
  EXPECT_NE(refusal(odd).find("num_key_value_heads"), std::string::npos);
  // transformers 5's layout: rope_parameters with the theta inside.
  std::string v5 = tiny(false);
  v5.insert(1, R"("rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 7.0},)");
  const HfConfig c = parse_hf_config(v5, "x");
  EXPECT_EQ(c.rope_type, "linear");
  EXPECT_EQ(c.rope_theta, 7.0);
  EXPECT_EQ(c.kv_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
}

TEST(HfModel, ASlidingWindowShorterThanTheContextIsRefused) {
  TempDir dir;
  std::string mistral = tiny(false, "MistralForCausalLM");
  mistral.insert(1, R"("sliding_window": 4,)");
  try {
    build(dir, mistral, 8);
    FAIL() << "a 4-token window under an 8-token context was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window 4"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(build(dir, mistral, 4));
}

}  // namespace
}  // namespace gpurun

// A Hugging Face model folder's config.json, for the Llama family gpurun trains as model.name
// `hf`: LlamaForCausalLM (Llama 2, 3, 3.1, 3.2), MistralForCausalLM and Qwen2ForCausalLM, as
// transformers' configuration_{llama,mistral,qwen2}.py define their keys and defaults. Both the
// layout transformers 4 writes (`rope_theta`, `rope_scaling`, `torch_dtype`) and the one of
// transformers 5 (`rope_parameters`, `dtype`) are read.
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

namespace gpurun {

struct HfConfig {
  std::string folder;         ///< the model folder
  std::string architecture;   ///< architectures[0]: LlamaForCausalLM, ...
  int64_t hidden = 0;         ///< hidden_size
  int64_t intermediate = 0;   ///< intermediate_size: the SwiGLU MLP's width
  int64_t layers = 0;         ///< num_hidden_layers
  int64_t heads = 0;          ///< num_attention_heads
  int64_t kv_heads = 0;       ///< num_key_value_heads (grouped-query attention; = heads: none)
  int64_t head_dim = 0;       ///< head_dim, else hidden / heads
  int64_t vocabulary = 0;     ///< vocab_size
  int64_t max_positions = 0;  ///< max_position_embeddings
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  /// default | linear | llama3 (rope_scaling's rope_type, or its older `type`)
  std::string rope_type = "default";
  double rope_factor = 1;                 ///< linear, llama3: factor
  double low_freq_factor = 1;             ///< llama3
  double high_freq_factor = 4;            ///< llama3
  int64_t original_max_positions = 8192;  ///< llama3: original_max_position_embeddings
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  ///< Qwen2 always; Llama's attention_bias (o_proj's too)
  bool o_bias = false;    ///< Llama's attention_bias
  bool mlp_bias = false;  ///< Llama's mlp_bias
  /// Attention sees at most this many earlier tokens (Mistral's sliding_window; Qwen2's when
  /// use_sliding_window); 0: all of them.
  int64_t sliding_window = 0;
  double initializer_range = 0.02;
  double attention_dropout = 0;
  /// The weights' dtype the folder declares (torch_dtype or dtype): float32, bfloat16,
  /// float16; "" when it declares none.
  std::string dtype;
  nlohmann::json json;  ///< config.json as read, for `gpurun export --format hf`
};

/// Reads `folder`/config.json. Throws ConfigError (exit 2) naming the file and the key for a
/// missing or unreadable file, an architecture other than the three, a required key missing or
/// out of range, an activation other than silu, a rope_scaling type other than linear and
/// llama3, or heads that do not divide (hidden by heads, heads by kv_heads).
HfConfig read_hf_config(const std::string& folder);

/// Parses config.json's text; `file` names it in messages. As read_hf_config().
HfConfig parse_hf_config(const std::string& text, const std::string& file);

/// config.json's dtype word of `dtype` ("float32", "bfloat16", "float16", "float64"; c10's
/// name for another), and back (float32 for a word it does not know).
std::string hf_dtype_name(c10::ScalarType dtype);
c10::ScalarType hf_dtype(const std::string& name);

/// Whether `folder` holds weights: model.safetensors, or model.safetensors.index.json.
bool hf_folder_has_weights(const std::string& folder);

/// The same config with `dtype` ("float32", "bfloat16", "float16") as the weights' dtype, in
/// the key the input used (transformers 4's torch_dtype, 5's dtype; torch_dtype when neither).
nlohmann::json hf_config_with_dtype(const nlohmann::json& config, const std::string& dtype);

}  // namespace gpurun

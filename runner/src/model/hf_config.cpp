#include "model/hf_config.h"

#include <cmath>
#include <exception>
#include <set>

#include "gpurun/errors.h"
#include "util/fs.h"

namespace gpurun {
namespace {

using json = nlohmann::json;

const std::set<std::string> kArchitectures = {"LlamaForCausalLM", "MistralForCausalLM",
                                              "Qwen2ForCausalLM"};

class Reader {
 public:
  Reader(const json& j, std::string file) : j_(j), file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw ConfigError(file_ + ": " + key + ": " + why);
  }

  bool has(const json& in, const std::string& key) const {
    return in.contains(key) && !in[key].is_null();
  }

  int64_t integer(const std::string& key, int64_t fallback, bool required, int64_t lo) const {
    if (!has(j_, key)) {
      if (required) fail(key, "missing; a Llama-family config.json has it");
      return fallback;
    }
    const json& v = j_[key];
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump());
    const int64_t n = v.get<int64_t>();
    if (n < lo) fail(key, "must be at least " + std::to_string(lo) + ", got " + v.dump());
    return n;
  }

  double number(const json& in, const std::string& key, double fallback,
                const std::string& where = "") const {
    if (!has(in, key)) return fallback;
    const json& v = in[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()))
      fail(where + key, "expected a number, got " + v.dump());
    return v.get<double>();
  }

  bool boolean(const std::string& key, bool fallback) const {
    if (!has(j_, key)) return fallback;
    if (!j_[key].is_boolean()) fail(key, "expected true or false, got " + j_[key].dump());
    return j_[key].get<bool>();
  }

  std::string text(const json& in, const std::string& key, const std::string& where = "") const {
    if (!has(in, key)) return "";
    if (!in[key].is_string()) fail(where + key, "expected a string, got " + in[key].dump());
    return in[key].get<std::string>();
  }

 private:
  const json& j_;
  std::string file_;
};

/// rope_scaling (transformers 4) or rope_parameters (5): the type and its numbers.
void read_rope(const Reader& r, const json& j, HfConfig& c) {
  c.rope_theta = r.number(j, "rope_theta", c.rope_theta);
  std::string key = "rope_scaling";
  json rope = j.value("rope_scaling", json());
  if (rope.is_null() && j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    key = "rope_parameters";
    rope = j["rope_parameters"];
    // transformers 5 keeps the theta with the type (one dict per attention type when a model
    // has several; the Llama family has one).
    c.rope_theta = r.number(rope, "rope_theta", c.rope_theta, key + ".");
  }
  if (rope.is_null()) return;
  if (!rope.is_object()) r.fail(key, "expected an object, got " + rope.dump());
  std::string type = r.text(rope, "rope_type", key + ".");
  if (type.empty()) type = r.text(rope, "type", key + ".");
  if (type.empty()) type = "default";
  if (type != "default" && type != "linear" && type != "llama3")
    r.fail(key + ".rope_type",
           "\"" + type +
               "\" is not supported; gpurun's Llama family has default, linear and llama3 "
               "rotary embeddings");
  c.rope_type = type;
  if (type == "default") return;
  c.rope_factor = r.number(rope, "factor", 0, key + ".");
  if (!(c.rope_factor > 0)) r.fail(key + ".factor", "must be a number above 0");
  if (type == "llama3") {
    c.low_freq_factor = r.number(rope, "low_freq_factor", 0, key + ".");
    c.high_freq_factor = r.number(rope, "high_freq_factor", 0, key + ".");
    c.original_max_positions =
        static_cast<int64_t>(r.number(rope, "original_max_position_embeddings", 0, key + "."));
    if (!(c.low_freq_factor > 0) || !(c.high_freq_factor > c.low_freq_factor) ||
        c.original_max_positions <= 0)
      r.fail(key,
             "llama3 needs factor, low_freq_factor < high_freq_factor and "
             "original_max_position_embeddings, all above 0; got " +
                 rope.dump());
  }
}

}  // namespace

HfConfig parse_hf_config(const std::string& text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw ConfigError(file + " is not JSON: " + e.what());
  }
  if (!j.is_object()) throw ConfigError(file + " is not a JSON object");
  const Reader r(j, file);
  HfConfig c;
  c.json = j;
  const json& archs = j.value("architectures", json());
  if (!archs.is_array() || archs.empty() || !archs[0].is_string())
    r.fail("architectures",
           "missing; expected a list naming one of LlamaForCausalLM, "
           "MistralForCausalLM, Qwen2ForCausalLM");
  c.architecture = archs[0].get<std::string>();
  if (!kArchitectures.count(c.architecture))
    r.fail("architectures", "\"" + c.architecture +
                                "\" is not supported; model.name hf trains LlamaForCausalLM, "
                                "MistralForCausalLM and Qwen2ForCausalLM");
  c.hidden = r.integer("hidden_size", 0, true, 1);
  c.intermediate = r.integer("intermediate_size", 0, true, 1);
  c.layers = r.integer("num_hidden_layers", 0, true, 1);
  c.heads = r.integer("num_attention_heads", 0, true, 1);
  c.kv_heads = r.integer("num_key_value_heads", c.heads, false, 1);
  c.vocabulary = r.integer("vocab_size", 0, true, 1);
  c.max_positions = r.integer("max_position_embeddings", 2048, false, 1);
  if (c.heads % c.kv_heads != 0)
    r.fail("num_key_value_heads", std::to_string(c.kv_heads) + " does not divide the " +
                                      std::to_string(c.heads) + " num_attention_heads");
  if (!j.contains("head_dim") || j["head_dim"].is_null()) {
    if (c.hidden % c.heads != 0)
      r.fail("num_attention_heads", std::to_string(c.heads) + " does not divide hidden_size " +
                                        std::to_string(c.hidden) + " (and no head_dim is given)");
    c.head_dim = c.hidden / c.heads;
  } else {
    c.head_dim = r.integer("head_dim", 0, true, 1);
  }
  if (c.head_dim % 2 != 0)
    r.fail("head_dim",
           "rotary embeddings need an even head width, got " + std::to_string(c.head_dim));
  c.rms_norm_eps = r.number(j, "rms_norm_eps", 1e-6);
  c.initializer_range = r.number(j, "initializer_range", 0.02);
  c.attention_dropout = r.number(j, "attention_dropout", 0);
  if (c.attention_dropout < 0 || c.attention_dropout >= 1)
    r.fail("attention_dropout", "must be in [0, 1)");
  const std::string act = r.text(j, "hidden_act");
  if (!act.empty() && act != "silu")
    r.fail("hidden_act", "\"" + act +
                             "\" is not supported; the Llama family's MLP is SwiGLU "
                             "(silu)");
  if (j.contains("pretraining_tp") && !j["pretraining_tp"].is_null() && j["pretraining_tp"] != 1)
    r.fail("pretraining_tp",
           "only 1 is supported (the weights' usual layout), got " + j["pretraining_tp"].dump());
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  if (c.architecture == "Qwen2ForCausalLM") {
    c.qkv_bias = true;
    if (r.boolean("use_sliding_window", false))
      c.sliding_window = r.integer("sliding_window", 0, false, 0);
  } else {
    c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
    c.mlp_bias = r.boolean("mlp_bias", false);
    if (c.architecture == "MistralForCausalLM")
      c.sliding_window = r.integer("sliding_window", 0, false, 0);
  }
  read_rope(r, j, c);
  c.dtype = r.text(j, "dtype");
  if (c.dtype.empty()) c.dtype = r.text(j, "torch_dtype");
  return c;
}

HfConfig read_hf_config(const std::string& folder) {
  const std::string file = folder + "/config.json";
  std::string text;
  try {
    text = fs::read_file(file);
  } catch (const std::exception& e) {
    throw ConfigError("model.path: " + folder +
                      " is not a Hugging Face model folder: cannot read its config.json (" +
                      e.what() + ")");
  }
  HfConfig c = parse_hf_config(text, file);
  c.folder = folder;
  return c;
}

std::string hf_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return "float32";
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::Half:
      return "float16";
    case c10::ScalarType::Double:
      return "float64";
    default:
      return c10::toString(dtype);
  }
}

c10::ScalarType hf_dtype(const std::string& name) {
  if (name == "bfloat16") return c10::ScalarType::BFloat16;
  if (name == "float16" || name == "half") return c10::ScalarType::Half;
  if (name == "float64") return c10::ScalarType::Double;
  return c10::ScalarType::Float;
}

bool hf_folder_has_weights(const std::string& folder) {
  return fs::exists(folder + "/model.safetensors") ||
         fs::exists(folder + "/model.safetensors.index.json");
}

json hf_config_with_dtype(const json& config, const std::string& dtype) {
  json out = config;
  if (out.contains("dtype"))
    out["dtype"] = dtype;
  else
    out["torch_dtype"] = dtype;
  return out;
}

}  // namespace gpurun

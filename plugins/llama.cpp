// The `hf` model: Hugging Face's Llama family (LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM) built from a model folder's config.json (model/hf_config.h), with
// transformers' module names, so that state_dict keys are the folder's safetensors keys and
// model.freeze / model.lora.targets take the names people use ("*.q_proj").
//
// ids [B, T] -> model.embed_tokens -> model.layers.i, each
//   h = x + self_attn(input_layernorm(x));  out = h + mlp(post_attention_layernorm(h))
// -> model.norm -> lm_head (or the embedding's weight, tie_word_embeddings) -> logits [B, T, V].
// Following transformers' modeling_llama.py op by op, so that the losses agree to float32's
// rounding:
// - RMSNorm (Zhang & Sennrich 2019): in fp32, x / sqrt(mean(x^2) + eps), cast back to the input's
//   dtype, times the weight;
// - rotary position embeddings (Su et al. 2021, "RoFormer"), the half-split layout
//   (rotate_half), inverse frequencies theta^(-2i/d) in fp32, scaled by rope_scaling `linear`
//   (Chen et al. 2023, position interpolation) or `llama3` (Meta's Llama 3.1 frequency bands);
// - grouped-query attention (Ainslie et al. 2023): each key/value head repeated for its group
//   (transformers' repeat_kv), then ATen's fused causal at::scaled_dot_product_attention with
//   scale head_dim^-0.5: FlashAttention-2 or the memory-efficient kernel on CUDA, ATen's flash
//   kernel on a CPU, none of which keeps the [T, T] scores;
// - the SwiGLU MLP (Shazeer 2020): down_proj(silu(gate_proj(x)) * up_proj(x)).
// Segments: "embed", "layer0".."layerN-1" (one decoder layer each: the unit of activation
// checkpointing), "head". The modules are registered under transformers' names; the segments
// only order them (SegmentedModel::add_segment_over).
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/where.h>
#include <c10/core/GradMode.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <mutex>
#include <optional>

#include "builtin.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "model/autocast_scope.h"
#include "model/hf_config.h"
#include "model/without_weights.h"

namespace gpurun {
namespace {

namespace nn = torch::nn;

nn::Linear linear(int64_t in, int64_t out, bool bias, double std) {
  nn::Linear l(nn::LinearOptions(in, out).bias(bias));
  nn::init::normal_(l->weight, 0.0, std);  // transformers' _init_weights
  if (bias) nn::init::zeros_(l->bias);
  return l;
}

/// LlamaRMSNorm: [..., width] -> [..., width] in the input's dtype.
class RmsNormImpl : public nn::Module {
 public:
  RmsNormImpl(int64_t width, double eps)
      : weight(register_parameter("weight", at::ones({width}))), eps_(eps) {}
  at::Tensor forward(const at::Tensor& x) {
    const auto dtype = x.scalar_type();
    at::Tensor h = x.to(at::kFloat);
    h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    return weight * h.to(dtype);
  }
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

/// cos and sin of every position's rotation angles, [T, head_dim] in fp32 on the device they
/// are asked for, cached (they depend on T and the config alone). Not a module: transformers
/// keeps inv_freq as a buffer outside the state_dict (persistent=False), and so does this.
class Rotary {
 public:
  explicit Rotary(const HfConfig& c) : config_(c) {}

  /// {cos, sin} [T, head_dim] fp32 on `device`.
  std::pair<at::Tensor, at::Tensor> get(int64_t time, c10::Device device) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cos_.defined() && time == time_ && cos_.device() == device) return {cos_, sin_};
    c10::NoGradGuard no_grad;
    // Outside autocast, as transformers' rotary embedding computes them: in fp32.
    AutocastScope off(device.type(), false, at::kFloat);
    if (!inv_freq_.defined()) inv_freq_ = inverse_frequencies(config_);
    const at::Tensor inv = inv_freq_.to(device);
    const at::Tensor positions = at::arange(time, inv.options().dtype(at::kLong)).to(at::kFloat);
    const at::Tensor freqs = at::outer(positions, inv);
    const at::Tensor emb = at::cat({freqs, freqs}, -1);
    cos_ = emb.cos();
    sin_ = emb.sin();
    time_ = time;
    return {cos_, sin_};
  }

 private:
  /// 1 / theta^(arange(0, d, 2) / d) [d / 2], in fp32 as transformers computes them; computed at
  /// the first forward pass, not when the model is built (a model built without its weights
  /// runs no initialiser, nor would it run these ops).
  static at::Tensor inverse_frequencies(const HfConfig& c) {
    const at::Tensor exponent =
        at::arange(0, c.head_dim, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
        static_cast<double>(c.head_dim);
    // Python's `x / tensor` is tensor.reciprocal() * x (Tensor.__rtruediv__): the same here.
    at::Tensor inv = at::pow(c.rope_theta, exponent).reciprocal();
    if (c.rope_type == "linear") inv = inv / c.rope_factor;
    if (c.rope_type == "llama3") {
      // transformers' _compute_llama3_parameters: long wavelengths divided by the factor, short
      // ones kept, the band between interpolated smoothly.
      const double old = static_cast<double>(c.original_max_positions);
      const double low_wavelen = old / c.low_freq_factor;
      const double high_wavelen = old / c.high_freq_factor;
      const at::Tensor wavelen = inv.reciprocal() * (2 * M_PI);
      at::Tensor scaled = at::where(wavelen > low_wavelen, inv / c.rope_factor, inv);
      const at::Tensor smooth = (wavelen.reciprocal() * old - c.low_freq_factor) /
                                (c.high_freq_factor - c.low_freq_factor);
      const at::Tensor smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
      const at::Tensor medium =
          (wavelen < high_wavelen).logical_not() * (wavelen > low_wavelen).logical_not();
      inv = at::where(medium, smoothed, scaled);
    }
    return inv;
  }

  HfConfig config_;
  at::Tensor inv_freq_;
  std::mutex mutex_;
  at::Tensor cos_, sin_;
  int64_t time_ = -1;
};
/// [..., d] -> [..., d]: (x1, x2) -> (-x2, x1) for the halves of the last dimension.
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

/// Causal self-attention with grouped-query heads: x [B, T, hidden] -> [B, T, hidden].
class AttentionImpl : public nn::Module {
 public:
  AttentionImpl(const HfConfig& c, std::shared_ptr<Rotary> rotary)
      : heads_(c.heads),
        kv_heads_(c.kv_heads),
        head_dim_(c.head_dim),
        dropout_(c.attention_dropout),
        rotary_(std::move(rotary)),
        q_proj(register_module(
            "q_proj", linear(c.hidden, c.heads * c.head_dim, c.qkv_bias, c.initializer_range))),
        k_proj(register_module(
            "k_proj", linear(c.hidden, c.kv_heads * c.head_dim, c.qkv_bias, c.initializer_range))),
        v_proj(register_module(
            "v_proj", linear(c.hidden, c.kv_heads * c.head_dim, c.qkv_bias, c.initializer_range))),
        o_proj(register_module(
            "o_proj", linear(c.heads * c.head_dim, c.hidden, c.o_bias, c.initializer_range))) {}

  at::Tensor forward(const at::Tensor& x) {
    const int64_t batch = x.size(0), time = x.size(1);
    auto [cos, sin] = rotary_->get(time, x.device());
    // transformers casts them to the hidden states' dtype, [1, 1, T, d] against [B, heads, T, d].
    cos = cos.to(x.scalar_type()).unsqueeze(0).unsqueeze(0);
    sin = sin.to(x.scalar_type()).unsqueeze(0).unsqueeze(0);
    at::Tensor q = q_proj(x).view({batch, time, heads_, head_dim_}).transpose(1, 2);
    at::Tensor k = k_proj(x).view({batch, time, kv_heads_, head_dim_}).transpose(1, 2);
    at::Tensor v = v_proj(x).view({batch, time, kv_heads_, head_dim_}).transpose(1, 2);
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    if (kv_heads_ != heads_) {
      // repeat_kv: [B, kv, T, d] -> [B, kv, groups, T, d] -> [B, heads, T, d], so that the fused
      // kernels, which take as many key heads as query heads, run.
      const int64_t groups = heads_ / kv_heads_;
      k = k.unsqueeze(2)
              .expand({batch, kv_heads_, groups, time, head_dim_})
              .reshape({batch, heads_, time, head_dim_});
      v = v.unsqueeze(2)
              .expand({batch, kv_heads_, groups, time, head_dim_})
              .reshape({batch, heads_, time, head_dim_});
    }
    at::Tensor y = at::scaled_dot_product_attention(
        q, k, v, /*attn_mask=*/{}, is_training() ? dropout_ : 0.0, /*is_causal=*/true,
        std::pow(static_cast<double>(head_dim_), -0.5));
    y = y.transpose(1, 2).reshape({batch, time, heads_ * head_dim_});
    return o_proj(y);
  }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  double dropout_;
  std::shared_ptr<Rotary> rotary_;

 public:
  nn::Linear q_proj, k_proj, v_proj, o_proj;
};
TORCH_MODULE(Attention);

/// SwiGLU: [B, T, hidden] -> [B, T, hidden].
class MlpImpl : public nn::Module {
 public:
  explicit MlpImpl(const HfConfig& c)
      : gate_proj(register_module(
            "gate_proj", linear(c.hidden, c.intermediate, c.mlp_bias, c.initializer_range))),
        up_proj(register_module("up_proj",
                                linear(c.hidden, c.intermediate, c.mlp_bias, c.initializer_range))),
        down_proj(register_module(
            "down_proj", linear(c.intermediate, c.hidden, c.mlp_bias, c.initializer_range))) {}
  at::Tensor forward(const at::Tensor& x) { return down_proj(at::silu(gate_proj(x)) * up_proj(x)); }
  nn::Linear gate_proj, up_proj, down_proj;
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public nn::Module {
 public:
  DecoderLayerImpl(const HfConfig& c, const std::shared_ptr<Rotary>& rotary)
      : self_attn(register_module("self_attn", Attention(c, rotary))),
        mlp(register_module("mlp", Mlp(c))),
        input_layernorm(register_module("input_layernorm", RmsNorm(c.hidden, c.rms_norm_eps))),
        post_attention_layernorm(
            register_module("post_attention_layernorm", RmsNorm(c.hidden, c.rms_norm_eps))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = x + self_attn(input_layernorm(x));
    return h + mlp(post_attention_layernorm(h));
  }
  Attention self_attn;
  Mlp mlp;
  RmsNorm input_layernorm, post_attention_layernorm;
};
TORCH_MODULE(DecoderLayer);

/// transformers' LlamaModel: what the state_dict calls `model.*`.
class BodyImpl : public nn::Module {
 public:
  explicit BodyImpl(const HfConfig& c) {
    const std::shared_ptr<Rotary> rotary = std::make_shared<Rotary>(c);
    embed_tokens = register_module("embed_tokens", nn::Embedding(c.vocabulary, c.hidden));
    nn::init::normal_(embed_tokens->weight, 0.0, c.initializer_range);
    layers = register_module("layers", nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) {
      DecoderLayer layer(c, rotary);
      layers->push_back(layer);
      decoder.push_back(layer);
    }
    norm = register_module("norm", RmsNorm(c.hidden, c.rms_norm_eps));
  }
  at::Tensor forward(const at::Tensor&) { TORCH_CHECK(false, "hf: the body runs as segments"); }
  nn::Embedding embed_tokens{nullptr};
  nn::ModuleList layers{nullptr};
  std::vector<DecoderLayer> decoder;
  RmsNorm norm{nullptr};
};
TORCH_MODULE(Body);

/// The "embed" segment: ids [B, T] (int64; floating ids, as the memory estimator probes with,
/// are truncated) -> [B, T, hidden].
class EmbedImpl : public nn::Module {
 public:
  explicit EmbedImpl(nn::Embedding embedding)
      : embedding_(register_module("embed_tokens", std::move(embedding))) {}
  at::Tensor forward(at::Tensor ids) {
    if (ids.is_floating_point()) ids = ids.to(at::kLong);
    TORCH_CHECK(ids.dim() == 2, "hf: expected token ids [batch, time], got ", ids.sizes());
    return embedding_(ids);
  }

 private:
  nn::Embedding embedding_;
};
TORCH_MODULE(Embed);

/// The "head" segment: [B, T, hidden] -> model.norm -> logits [B, T, vocabulary], through
/// lm_head or, tied, the embedding's own weight (a parameter of this segment too, so that a
/// checkpointed head passes its gradient on).
class HeadImpl : public nn::Module {
 public:
  HeadImpl(RmsNorm norm, nn::Linear lm_head, const at::Tensor& tied)
      : norm_(register_module("norm", std::move(norm))) {
    if (lm_head)
      lm_head_ = register_module("lm_head", std::move(lm_head));
    else
      tied_ = register_parameter("tied_weight", tied);
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = norm_(x);
    return lm_head_ ? lm_head_(h) : at::linear(h, tied_);
  }

 private:
  RmsNorm norm_;
  nn::Linear lm_head_{nullptr};
  at::Tensor tied_;
};
TORCH_MODULE(Head);

/// What autograd keeps per sample of `time` tokens, segment by segment, from the forward passes
/// above op by op (the tensors each op's backward formula takes, PyTorch's derivatives.yaml),
/// as gpt_activations does for `gpt` (Korthikanti et al. 2022, section 4.1). c: bytes of the
/// products' inputs and outputs (2 under autocast, else 4); r: the residual stream's (the
/// weights' dtype). RMSNorm keeps its fp32 input (pow and mul), 1/rms, and its cast-back output
/// (the weight's mul); an input autocast casts is cast once per product that reads it (q, k, v;
/// gate, up), so it is kept once per product unless it is already in c.
std::vector<SegmentActivations> llama_activations(const HfConfig& m, int64_t time,
                                                  const ActivationDtypes& d) {
  const int64_t c = d.compute, r = d.weights, w = m.hidden, inner = m.intermediate;
  const int64_t qw = m.heads * m.head_dim, kvw = m.kv_heads * m.head_dim;
  const int64_t norm = 4 * w + (r == 4 ? 0 : r * w) + 4;
  const int64_t qkv_inputs = c == r ? c * w : 3 * c * w;
  const int64_t mlp_inputs = c == r ? c * w : 2 * c * w;
  // Attention: the rotated q and k, the repeated k and v (as many heads as q), the kernel's
  // output and its log-sum-exp (fp32, per head); the output is o_proj's input.
  const int64_t attention = norm + qkv_inputs + c * qw + 2 * c * qw + c * qw + 4 * m.heads;
  // MLP: gate's output (silu's input), silu's output and up's output (the product's inputs), the
  // product (down's input).
  const int64_t mlp = norm + mlp_inputs + 4 * c * inner;
  const double t = static_cast<double>(time), dw = static_cast<double>(w);
  const double products = dw * (2.0 * qw + 2.0 * kvw) + 3.0 * dw * static_cast<double>(inner);
  const double layer_flops = t * (2.0 * products + 2.0 * 2.0 * t * static_cast<double>(qw));
  const int64_t v = m.vocabulary;
  std::vector<SegmentActivations> out;
  out.push_back({time * 8, time * 8, time * r * w, 0.0});
  for (int64_t i = 0; i < m.layers; ++i)
    out.push_back(
        {time * r * w, time * (attention + mlp), time * 4 * std::max(inner, w), layer_flops});
  out.push_back({time * r * w, time * (norm + c * w + c * v + 4 * v), time * 4 * v,
                 t * 2.0 * dw * static_cast<double>(v)});
  return out;
}

std::shared_ptr<SegmentedModel> make_hf(const ModelConfig& config,
                                        const std::vector<int64_t>& shape, int64_t vocabulary) {
  const HfConfig c = read_hf_config(config.path);
  if (shape.size() != 1)
    throw ConfigError(
        "model hf needs token sequences [time] (data.name tokens); the dataset "
        "gives samples of " +
        std::to_string(shape.size()) + " dimensions");
  if (vocabulary > c.vocabulary)
    throw ConfigError("model.path: " + c.folder + "/config.json: vocab_size " +
                      std::to_string(c.vocabulary) + " is smaller than the data's " +
                      std::to_string(vocabulary) + " token ids (data.vocab_size)");
  if (c.sliding_window > 0 && c.sliding_window < shape[0])
    throw ConfigError("model.path: " + c.folder + "/config.json: sliding_window " +
                      std::to_string(c.sliding_window) + " is shorter than data.context " +
                      std::to_string(shape[0]) +
                      ": gpurun's attention sees the whole context; set data.context to at most " +
                      std::to_string(c.sliding_window));
  // A folder with weights is loaded before its first step (train/hf_weights.h): its tensors are
  // allocated, never initialised, so that no page of them is written twice (and a model held in
  // 16 bits never has its fp32 pages written at all).
  std::optional<WithoutWeights> unwritten;
  if (hf_folder_has_weights(c.folder)) unwritten.emplace();
  auto model = std::make_shared<SegmentedModel>();
  Body body = model->register_module("model", Body(c));
  nn::Linear lm_head{nullptr};
  if (!c.tie_word_embeddings)
    lm_head = model->register_module(
        "lm_head", linear(c.hidden, c.vocabulary, /*bias=*/false, c.initializer_range));
  model->add_segment_over("embed", nn::Sequential(Embed(body->embed_tokens)));
  for (int64_t i = 0; i < c.layers; ++i)
    model->add_segment_over("layer" + std::to_string(i),
                            nn::Sequential(body->decoder[static_cast<size_t>(i)]));
  model->add_segment_over("head",
                          nn::Sequential(Head(body->norm, lm_head, body->embed_tokens->weight)));
  model->set_activation_estimate(
      [c, time = shape[0]](const ActivationDtypes& d) { return llama_activations(c, time, d); });
  if (unwritten) {
    // Built as meta tensors: given storage now, allocated and never written (the kernel maps
    // no page of it until the weights' copy writes it).
    unwritten.reset();
    c10::NoGradGuard no_grad;
    for (auto& entry : state_dict(*model))
      entry.second.set_data(
          at::empty(entry.second.sizes(), entry.second.options().device(c10::kCPU)));
  }
  return model;
}

}  // namespace

void register_hf_model(Registry& registry) { registry.add_model("hf", make_hf); }

}  // namespace gpurun

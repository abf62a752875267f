// The `gpt` model: a decoder-only transformer (Radford et al. 2018, "Improving Language
// Understanding by Generative Pre-Training"; 2019, "Language Models are Unsupervised
// Multitask Learners" for the pre-LayerNorm blocks and the initialisation).
//
// ids [B, T] -> token + learned position embeddings -> model.layers blocks of
//   x = x + attention(LayerNorm(x));  x = x + MLP(LayerNorm(x))
// -> LayerNorm -> linear head -> logits [B, T, vocabulary], position t seeing tokens 0..t only.
// Attention is causal multi-head scaled dot-product attention (Vaswani et al. 2017,
// "Attention Is All You Need", eq. 1) through ATen's fused at::scaled_dot_product_attention,
// as torch.nn.functional.scaled_dot_product_attention(is_causal=True): FlashAttention-2 or the
// memory-efficient kernel on CUDA, ATen's flash kernel on a CPU, none of which keeps the
// [T, T] scores for the backward pass (Dao 2023, "FlashAttention-2"); with attention dropout on
// a CPU, ATen takes its math path, which does. The MLP is width -> 4 width -> GELU -> width. Linear
// and embedding weights start N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 layers))
// (GPT-2, section 2.3). The head is not tied to the token embedding: tying would share one
// parameter between two activation-checkpointing segments.
//
// Segments: "embed", "block0".."blockN-1" (one transformer block each), "head".
#include <ATen/ops/arange.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <limits>

#include "builtin.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"

namespace gpurun {
namespace {

namespace nn = torch::nn;

constexpr double kInitStd = 0.02;

nn::Linear linear(int64_t in, int64_t out, double std = kInitStd, bool bias = true) {
  nn::Linear l(nn::LinearOptions(in, out).bias(bias));
  nn::init::normal_(l->weight, 0.0, std);
  if (bias) nn::init::zeros_(l->bias);
  return l;
}

/// ids [B, T] int64 (floating ids are truncated: the memory estimator probes with zeros)
/// -> token embedding + position embedding, dropout: [B, T, width]. T <= context.
class EmbeddingImpl : public nn::Module {
 public:
  EmbeddingImpl(int64_t vocabulary, int64_t context, int64_t width, double dropout)
      : tokens_(register_module("tokens", nn::Embedding(vocabulary, width))),
        positions_(register_module("positions", nn::Embedding(context, width))),
        dropout_(register_module("dropout", nn::Dropout(dropout))) {
    nn::init::normal_(tokens_->weight, 0.0, kInitStd);
    nn::init::normal_(positions_->weight, 0.0, kInitStd);
  }

  torch::Tensor forward(torch::Tensor ids) {
    if (ids.is_floating_point()) ids = ids.to(torch::kLong);
    TORCH_CHECK(ids.dim() == 2, "gpt: expected token ids [batch, time], got ", ids.sizes());
    const int64_t time = ids.size(1), context = positions_->weight.size(0);
    TORCH_CHECK(time <= context, "gpt: a sequence of ", time, " tokens is longer than the ",
                context, " positions of model.context");
    torch::Tensor where = at::arange(time, ids.options().dtype(torch::kLong));
    return dropout_(tokens_(ids) + positions_(where));
  }

 private:
  nn::Embedding tokens_, positions_;
  nn::Dropout dropout_;
};
TORCH_MODULE(Embedding);

/// Causal multi-head self-attention: x [B, T, width] -> [B, T, width]. Scores
/// softmax(Q K^T / sqrt(d)) with every future position (key after query) left out, and dropout
/// of `dropout` on the attention weights while training, all inside the fused kernel.
class CausalSelfAttentionImpl : public nn::Module {
 public:
  CausalSelfAttentionImpl(int64_t width, int64_t heads, double dropout, double projection_std)
      : heads_(heads),
        dropout_(dropout),
        qkv_(register_module("qkv", linear(width, 3 * width))),
        projection_(register_module("projection", linear(width, width, projection_std))),
        residual_dropout_(register_module("residual_dropout", nn::Dropout(dropout))) {}

  torch::Tensor forward(torch::Tensor x) {
    const int64_t batch = x.size(0), time = x.size(1), width = x.size(2);
    const int64_t head_width = width / heads_;
    // [B, T, 3 width] -> [3, B, heads, T, head width]: views, each head's width contiguous as
    // the fused kernels need it.
    torch::Tensor qkv = qkv_(x).view({batch, time, 3, heads_, head_width}).permute({2, 0, 3, 1, 4});
    torch::Tensor y = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], /*attn_mask=*/{},
                                                       is_training() ? dropout_ : 0.0,
                                                       /*is_causal=*/true);
    // [B, heads, T, head width] -> [B, T, width]; the kernels write [B, T, heads, head width],
    // so this is a view, not a copy.
    y = y.transpose(1, 2).reshape({batch, time, width});
    return residual_dropout_(projection_(y));
  }

 private:
  int64_t heads_;
  double dropout_;
  nn::Linear qkv_, projection_;
  nn::Dropout residual_dropout_;
};
TORCH_MODULE(CausalSelfAttention);

/// Pre-LayerNorm transformer block: [B, T, width] -> [B, T, width].
class BlockImpl : public nn::Module {
 public:
  BlockImpl(int64_t width, int64_t heads, double dropout, double projection_std)
      : norm1_(register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({width})))),
        attention_(register_module("attention",
                                   CausalSelfAttention(width, heads, dropout, projection_std))),
        norm2_(register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({width})))),
        expand_(register_module("expand", linear(width, 4 * width))),
        contract_(register_module("contract", linear(4 * width, width, projection_std))),
        gelu_(register_module("gelu", nn::GELU())),
        dropout_(register_module("dropout", nn::Dropout(dropout))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = x + attention_(norm1_(x));
    return x + dropout_(contract_(gelu_(expand_(norm2_(x)))));
  }

 private:
  nn::LayerNorm norm1_;
  CausalSelfAttention attention_;
  nn::LayerNorm norm2_;
  nn::Linear expand_, contract_;
  nn::GELU gelu_;
  nn::Dropout dropout_;
};
TORCH_MODULE(Block);

/// What autograd keeps per sample of `time` tokens, segment by segment, following the
/// forward passes above op by op (the tensors each op's backward formula takes, PyTorch's
/// derivatives.yaml). The form is Korthikanti et al. 2022 ("Reducing Activation Recomputation
/// in Large Transformer Models", section 4.1): per block and token a multiple of the width.
/// Fused attention keeps its output and the softmax's log-sum-exp (fp32, one a head and token)
/// instead of the scores; ATen's math path (attention dropout on a CPU) keeps a multiple of
/// heads x time. c: the dtype of products (2 under autocast, else 4); the residual stream and
/// LayerNorm run in the weights' dtype (fp32, or 16 bits when the run holds the model in 16
/// bits).
std::vector<SegmentActivations> gpt_activations(int64_t time, int64_t width, int64_t heads,
                                                int64_t layers, double p, int64_t vocabulary,
                                                const ActivationDtypes& d) {
  const int64_t c = d.compute, w = width, scores = heads * time;
  // The residual stream, in the weights' dtype r (fp32, or 16 bits with master weights).
  const int64_t r = d.weights;
  const int64_t norm = r * w + 8;  // LayerNorm: its input, mean and 1/std (fp32)
  // The kernel at::scaled_dot_product_attention picks: a fused one (FlashAttention-2 or the
  // memory-efficient one on CUDA, dropout included; ATen's flash kernel on a CPU without
  // dropout) keeps the log-sum-exp of each head and query, fp32; ATen's math path (a CPU with
  // attention dropout) computes in fp32 whatever the autocast dtype and keeps q and k scaled, a
  // contiguous v, softmax's output, dropout's mask and its output (measured with
  // torch.autograd.graph.saved_tensors_hooks on PyTorch 2.11).
  const bool fused = d.cuda || p == 0;
  const int64_t attention_kept = fused ? 4 * heads : 3 * 4 * w + scores * 3 * 4;
  // Attention: norm1, the qkv product's input (c) and output (3w: q, k and v are views of it),
  // what the kernel keeps, its output (the projection's input, a view); its residual dropout.
  const int64_t attention =
      norm + c * w + 3 * c * w + attention_kept + c * w + d.dropout_mask(p, c) * w;
  // MLP: norm2, the expansion's input (c), GELU's input (4w), the contraction's input (4w),
  // its dropout's mask.
  const int64_t mlp = norm + c * w + 4 * c * w + 4 * c * w + d.dropout_mask(p, c) * w;
  // FLOPs per token: the four products of width (qkv 3w^2, projection w^2, MLP 8w^2) and the
  // two of the scores with every position (q k^T, attention v).
  const double t = static_cast<double>(time), dw = static_cast<double>(w);
  const double block_flops = t * (2.0 * 12.0 * dw * dw + 2.0 * 2.0 * t * dw);
  std::vector<SegmentActivations> out;
  // Embedding: the ids (int64) and the dropout's mask of the fp32 sum.
  out.push_back({time * 8, time * (8 + d.dropout_mask(p, r) * w), time * r * w, 0.0});
  for (int64_t i = 0; i < layers; ++i)
    out.push_back({time * r * w, time * (attention + mlp),
                   fused ? time * 4 * w : std::max(scores * time * 4, time * 4 * w), block_flops});
  // Head: the final LayerNorm, the product's input, and log-softmax's fp32 output in the loss.
  out.push_back({time * r * w, time * (norm + c * w + c * vocabulary + 4 * vocabulary),
                 time * 4 * vocabulary, t * 2.0 * dw * static_cast<double>(vocabulary)});
  return out;
}

std::shared_ptr<SegmentedModel> make_gpt(const ModelConfig& c, const std::vector<int64_t>& shape,
                                         int64_t vocabulary) {
  if (shape.size() != 1)
    throw ConfigError(
        "model gpt needs token sequences [time] (data.name text); the dataset gives "
        "samples of " +
        std::to_string(shape.size()) + " dimensions");
  if (c.width % c.heads != 0)
    throw ConfigError("model.width must be divisible by model.heads, got " +
                      std::to_string(c.width) + " and " + std::to_string(c.heads));
  const int64_t context = c.context > 0 ? c.context : shape[0];
  if (context < shape[0])
    throw ConfigError("model.context " + std::to_string(c.context) + " is shorter than the " +
                      std::to_string(shape[0]) + " tokens of every sample (data.context)");
  const double projection_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.layers));
  auto model = std::make_shared<SegmentedModel>();
  model->add_segment("embed", nn::Sequential(Embedding(vocabulary, context, c.width, c.dropout)));
  for (int64_t i = 0; i < c.layers; ++i)
    model->add_segment("block" + std::to_string(i),
                       nn::Sequential(Block(c.width, c.heads, c.dropout, projection_std)));
  model->add_segment("head", nn::Sequential(nn::LayerNorm(nn::LayerNormOptions({c.width})),
                                            linear(c.width, vocabulary, kInitStd, /*bias=*/false)));
  model->set_activation_estimate([time = shape[0], width = c.width, heads = c.heads,
                                  layers = c.layers, p = c.dropout,
                                  vocabulary](const ActivationDtypes& d) {
    return gpt_activations(time, width, heads, layers, p, vocabulary, d);
  });
  return model;
}

}  // namespace

void register_gpt_model(Registry& registry) { registry.add_model("gpt", make_gpt); }

}  // namespace gpurun

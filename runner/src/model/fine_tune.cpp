#include "model/fine_tune.h"

#include <fnmatch.h>

#include <ATen/ops/addmm.h>
#include <ATen/ops/bernoulli.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <c10/core/GradMode.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <map>
#include <memory>

#include <spdlog/spdlog.h>

#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "model/autocast_scope.h"

namespace gpurun {
namespace {

/// Up to `most` of `names`, comma-separated, with how many more there are.
std::string some_of(const std::vector<std::string>& names, size_t most = 6) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < most; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > most) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out.empty() ? "none" : out;
}

bool any_matches(const std::vector<std::string>& patterns, const std::string& name) {
  for (const std::string& p : patterns)
    if (name_matches(p, name)) return true;
  return false;
}

/// The first of `patterns` that matches none of `names`, or nullptr.
const std::string* unmatched_pattern(const std::vector<std::string>& patterns,
                                     const std::vector<std::string>& names) {
  for (const std::string& pattern : patterns)
    if (std::none_of(names.begin(), names.end(),
                     [&](const std::string& n) { return name_matches(pattern, n); }))
      return &pattern;
  return nullptr;
}

/// The layer of `name` when it ends in `suffix` ("a.b.lora_A", ".lora_A" -> "a.b"), else "".
/// One adapted Linear layer.
struct Adapter {
  torch::nn::LinearImpl* linear;  ///< owned by the model, which owns the prologue holding us
  at::Tensor base;                ///< the registered (frozen) weight W [out, in]
  at::Tensor a, b;                ///< lora_A [rank, in], lora_B [out, rank]
  double scale, dropout;

  /// linear.weight = W + B A scale (columns dropped in training with dropout > 0).
  void apply() {
    // Summed in float32, the dtype of the weight it replaces, whatever the forward runs under.
    const c10::DeviceType type = base.device().type();
    AutocastScope no_autocast(type, false, at::autocast::get_autocast_dtype(type));
    at::Tensor delta_a = a;
    if (dropout > 0 && linear->is_training()) {  // as nn::Dropout: training mode decides
      const at::Tensor keep =
          at::bernoulli(at::full({1, a.size(1)}, 1.0 - dropout, a.options().requires_grad(false)));
      delta_a = a * keep / (1.0 - dropout);
    }
    linear->weight = at::addmm(base, b, delta_a, /*beta=*/1.0, /*alpha=*/scale);
  }
};

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> named_trainable_parameters(
    const torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& entry : model.named_parameters())
    if (entry.value().requires_grad()) out.emplace_back(entry.key(), entry.value());
  return out;
}

std::vector<at::Tensor> trainable_parameters(const torch::nn::Module& model) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : model.parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

ParameterCounts count_parameters(const torch::nn::Module& model) {
  ParameterCounts c;
  for (const at::Tensor& p : model.parameters()) {
    c.total += p.numel();
    if (p.requires_grad()) c.trainable += p.numel();
  }
  return c;
}

std::string layer_of(const std::string& name, const std::string& suffix) {
  return name.size() > suffix.size() &&
                 name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0
             ? name.substr(0, name.size() - suffix.size())
             : std::string();
}

bool is_lora_adapter(const std::string& name) {
  return !layer_of(name, ".lora_A").empty() || !layer_of(name, ".lora_B").empty();
}

bool name_matches(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

int64_t freeze_parameters(torch::nn::Module& model, const std::vector<std::string>& patterns) {
  const auto named = model.named_parameters(/*recurse=*/true);
  std::vector<std::string> names;
  for (const auto& item : named) names.push_back(item.key());
  if (const std::string* pattern = unmatched_pattern(patterns, names))
    throw ConfigError("model.freeze: the pattern \"" + *pattern +
                      "\" matches no parameter of the model; its parameters are named " +
                      some_of(names) + " (`*` also matches dots)");
  int64_t frozen = 0;
  for (const auto& item : named) {
    if (!any_matches(patterns, item.key())) continue;
    if (item.value().requires_grad()) ++frozen;
    item.value().requires_grad_(false);
  }
  return frozen;
}

std::vector<std::string> add_lora_adapters(SegmentedModel& model, const LoraConfig& lora) {
  if (model.segments().empty())
    throw ConfigError(
        "model.lora needs a model built of segments (a built-in model or a plugin's); a "
        "TorchScript module's layers cannot be adapted");
  const double scale = lora.alpha / static_cast<double>(lora.rank);
  std::vector<std::string> adapted, linears, full_rank;
  std::vector<std::vector<std::shared_ptr<Adapter>>> per_segment(model.segments().size());
  // Each Linear by the name state_dict() gives it, in the segment that runs it (a model may
  // register its modules under names of its own: SegmentedModel::add_segment_over).
  std::map<const torch::nn::Module*, size_t> segment_of;
  for (size_t i = 0; i < model.segments().size(); ++i)
    for (const auto& module : model.segments()[i]->modules(/*include_self=*/false))
      segment_of.emplace(module.get(), i);
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    {
      auto* linear = item.value()->as<torch::nn::Linear>();
      const auto where = segment_of.find(item.value().get());
      if (!linear || where == segment_of.end()) continue;
      const size_t i = where->second;
      linears.push_back(item.key());
      if (!any_matches(lora.targets, item.key())) continue;
      const int64_t out = linear->weight.size(0), in = linear->weight.size(1);
      if (lora.rank >= std::min(in, out))
        full_rank.push_back(item.key() + " (" + std::to_string(out) + " x " + std::to_string(in) +
                            ")");
      const auto options = linear->weight.options();
      at::Tensor a = at::empty({lora.rank, in}, options);
      {
        c10::NoGradGuard no_grad;
        torch::nn::init::normal_(a, 0.0, 1.0 / static_cast<double>(lora.rank));
      }
      at::Tensor b = at::zeros({out, lora.rank}, options);
      auto adapter = std::make_shared<Adapter>();
      adapter->linear = linear;
      adapter->base = linear->weight;
      adapter->a = linear->register_parameter("lora_A", a);
      adapter->b = linear->register_parameter("lora_B", b);
      adapter->scale = scale;
      adapter->dropout = lora.dropout;
      per_segment[i].push_back(adapter);
      adapted.push_back(item.key());
    }
  }
  if (const std::string* pattern = unmatched_pattern(lora.targets, linears))
    throw ConfigError("model.lora.targets: the pattern \"" + *pattern +
                      "\" matches no Linear layer of the model; its Linear layers are " +
                      some_of(linears, 48) + " (`*` also matches dots)");
  // B A of rank >= min(in, out) can be any update of the layer: the adapters then cost as much
  // as the full weight's gradient and optimizer state, or more (Hu et al. 2021 use rank << d).
  if (!full_rank.empty())
    spdlog::warn(
        "model.lora.rank {} is not below min(in, out) of {} of the {} adapted Linear layers "
        "({}): their adapters train as many parameters as the layer's own weight or more, so "
        "LoRA saves nothing there; use a rank well below the layers' width",
        lora.rank, full_rank.size(), adapted.size(), some_of(full_rank, 4));
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    item.value().requires_grad_(is_lora_adapter(item.key()));
  for (size_t i = 0; i < per_segment.size(); ++i) {
    if (per_segment[i].empty()) continue;
    model.set_segment_prologue(i, [adapters = per_segment[i]] {
      for (const auto& adapter : adapters) adapter->apply();
    });
  }
  return adapted;
}

std::vector<std::pair<std::string, at::Tensor>> merge_lora_adapters(
    const std::vector<std::pair<std::string, at::Tensor>>& state, double scale) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  const auto find = [&](const std::string& name) {
    const auto it = by_name.find(name);
    return it == by_name.end() ? at::Tensor() : it->second;
  };
  c10::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> merged;
  for (const auto& [name, tensor] : state) {
    const std::string a_layer = layer_of(name, ".lora_A"), b_layer = layer_of(name, ".lora_B");
    if (!a_layer.empty() && find(a_layer + ".lora_B").defined() &&
        find(a_layer + ".weight").defined())
      continue;
    if (!b_layer.empty() && find(b_layer + ".lora_A").defined() &&
        find(b_layer + ".weight").defined())
      continue;
    const std::string layer = layer_of(name, ".weight");
    const at::Tensor a = layer.empty() ? at::Tensor() : find(layer + ".lora_A");
    const at::Tensor b = layer.empty() ? at::Tensor() : find(layer + ".lora_B");
    if (a.defined() && b.defined())
      merged.emplace_back(
          name, at::addmm(tensor.to(at::kFloat), b.to(at::kFloat), a.to(at::kFloat), 1.0, scale)
                    .to(tensor.scalar_type()));
    else
      merged.emplace_back(name, tensor);
  }
  return merged;
}

}  // namespace gpurun

// Fine-tuning's memory levers on a built model: frozen parameters (model.freeze) and LoRA
// adapters (model.lora; Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "gpurun/config.h"

namespace torch::nn {
class Module;
}

namespace gpurun {

class SegmentedModel;

/// The parameters that require grad, in parameters()' order: what the optimizer updates, the
/// gradient sync sums and the estimate counts gradients and optimizer state for.
std::vector<at::Tensor> trainable_parameters(const torch::nn::Module& model);
/// trainable_parameters() with their names (state_dict keys).
std::vector<std::pair<std::string, at::Tensor>> named_trainable_parameters(
    const torch::nn::Module& model);

/// Elements (not bytes) of the trainable and of all parameters.
struct ParameterCounts {
  int64_t trainable = 0, total = 0;
};
ParameterCounts count_parameters(const torch::nn::Module& model);

/// Whether the dotted `name` matches `pattern` as fnmatch(3) matches without FNM_PATHNAME:
/// `*` and `?` also match dots, so "block0.*" covers every parameter under block0.
bool name_matches(const std::string& pattern, const std::string& name);

/// `name` without `suffix` ("model.layers.0.q_proj.lora_A", ".lora_A" -> "model.layers.0.q_proj"),
/// or "" when `name` does not end in it (or is nothing else).
std::string layer_of(const std::string& name, const std::string& suffix);

/// Whether `name` is one of the parameters add_lora_adapters() registers: "<layer>.lora_A" or
/// "<layer>.lora_B".
bool is_lora_adapter(const std::string& name);

/// model.freeze: sets requires_grad false on every parameter whose name matches a pattern.
/// Returns how many parameters (tensors) it froze. Throws ConfigError naming a pattern that
/// matches no parameter, with a few of the model's names.
int64_t freeze_parameters(torch::nn::Module& model, const std::vector<std::string>& patterns);

/// model.lora: gives every torch::nn::Linear of `model` whose module name matches one of
/// `lora.targets` two trainable parameters, `lora_A` [rank, in] drawn from N(0, 1/rank) (PEFT's
/// "gaussian" initialisation) and `lora_B` [out, rank] of zeros, so that training starts from
/// the base model exactly; and freezes every other parameter of the model. Before its segment
/// runs (SegmentedModel::set_segment_prologue), each such layer's weight becomes
///   W + B A (alpha / rank)          computed in float32, outside autocast
/// with the base W frozen and registered under its old name: the state_dict keeps the base
/// model's names plus `<layer>.lora_A` and `<layer>.lora_B`, and merge_lora_adapters() of it gives
/// the very weights the forward pass used. With lora.dropout p > 0 in training mode, the columns of
/// B A (the adapters' input features) are dropped with probability p and the rest scaled by
/// 1 / (1 - p), one mask per forward pass: the adapter is merged into the weight, so the mask
/// is shared by the micro-batch's samples, where PEFT draws one per sample.
/// Returns the names of the adapted layers. Throws ConfigError when the model has no segments
/// (a TorchScript module) or no Linear layer matches, naming the Linear layers there are.
std::vector<std::string> add_lora_adapters(SegmentedModel& model, const LoraConfig& lora);

/// A state_dict with LoRA adapters merged: every `X.weight` with `X.lora_A` and `X.lora_B`
/// beside it becomes W + B A scale (float32), and the adapters go; the rest is unchanged, in
/// order. `scale` is alpha / rank. Loads as the base architecture.
std::vector<std::pair<std::string, at::Tensor>> merge_lora_adapters(
    const std::vector<std::pair<std::string, at::Tensor>>& state, double scale);

}  // namespace gpurun

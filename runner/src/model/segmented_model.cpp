#include "gpurun/model.h"

#include <stdexcept>
#include <string>
#include <utility>

#include <c10/core/GradMode.h>

#include "model/activation_checkpointing.h"
#include "model/state_digest.h"
#include "util/hash.h"

namespace gpurun {

torch::Tensor SegmentedModel::forward(torch::Tensor x) {
  const bool checkpointing = !checkpointed_.empty() && is_training() && c10::GradMode::is_enabled();
  for (size_t i = 0; i < segments_.size(); ++i) {
    const std::function<void()> none;
    const std::function<void()>& prologue = i < prologues_.size() ? prologues_[i] : none;
    if (checkpointing && checkpointed_[i]) {
      x = checkpointed_forward(segments_[i], x, prologue);
    } else {
      if (prologue) prologue();
      x = segments_[i]->forward(x);
    }
  }
  return x;
}

void SegmentedModel::set_segment_prologue(size_t index, std::function<void()> prologue) {
  if (index >= segments_.size())
    throw std::out_of_range("set_segment_prologue: segment " + std::to_string(index) +
                            " of a model of " + std::to_string(segments_.size()) + " segments");
  prologues_.resize(segments_.size());
  prologues_[index] = std::move(prologue);
}

torch::nn::Sequential SegmentedModel::add_segment(const std::string& name,
                                                  torch::nn::Sequential segment) {
  segments_.push_back(register_module(name, segment));
  names_.push_back(name);
  if (!checkpointed_.empty()) checkpointed_.push_back(false);
  return segments_.back();
}

torch::nn::Sequential SegmentedModel::add_segment_over(const std::string& name,
                                                       torch::nn::Sequential segment) {
  segments_.push_back(std::move(segment));
  names_.push_back(name);
  if (!checkpointed_.empty()) checkpointed_.push_back(false);
  return segments_.back();
}

void SegmentedModel::set_checkpointed(std::vector<bool> flags) {
  if (!flags.empty() && flags.size() != segments_.size()) {
    throw std::invalid_argument("set_checkpointed: got " + std::to_string(flags.size()) +
                                " flags for a model of " + std::to_string(segments_.size()) +
                                " segments; give one flag per segment, or none to turn "
                                "checkpointing off");
  }
  checkpointed_ = std::move(flags);
}

namespace {
void collect(const torch::nn::Module& module, const std::string& prefix,
             std::vector<std::pair<std::string, torch::Tensor>>& out) {
  for (const auto& p : module.named_parameters(/*recurse=*/false))
    out.emplace_back(prefix + p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/false))
    out.emplace_back(prefix + b.key(), b.value());
  for (const auto& child : module.named_children())
    collect(*child.value(), prefix + child.key() + ".", out);
}
}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> state_dict(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  collect(model, "", out);
  return out;
}

std::string model_digest(const torch::nn::Module& model) { return state_digest(state_dict(model)); }

std::string state_digest(const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  Xxh3 h;
  for (const auto& entry : state) {
    torch::Tensor t = entry.second.detach().to(torch::kCPU).contiguous();
    h.update(t.data_ptr(), t.numel() * t.element_size());
  }
  return h.hex();
}

}  // namespace gpurun

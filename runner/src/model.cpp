#include "gpurun/model.h"

#include "gpurun/hash.h"

namespace gpurun {

torch::Tensor SegmentedModel::forward(torch::Tensor x) {
  for (auto& segment : segments_) x = segment->forward(x);
  return x;
}

torch::nn::Sequential SegmentedModel::add_segment(const std::string& name,
                                                  torch::nn::Sequential segment) {
  segments_.push_back(register_module(name, segment));
  names_.push_back(name);
  return segments_.back();
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

std::string model_digest(const torch::nn::Module& model) {
  Xxh3 h;
  for (const auto& entry : state_dict(model)) {
    torch::Tensor t = entry.second.detach().to(torch::kCPU).contiguous();
    h.update(t.data_ptr(), t.numel() * t.element_size());
  }
  return h.hex();
}

}  // namespace gpurun

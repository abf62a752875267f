#include "train/init_weights.h"

#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/format/pickle.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "model/fine_tune.h"
#include "util/fs.h"
#include "util/hash.h"

namespace gpurun {

nlohmann::json InitialWeights::to_json() const {
  return {{"path", path},
          {"xxh3", xxh3},
          {"loaded", loaded},
          {"not_loaded", not_loaded},
          {"unused", unused}};
}

std::string shape_text(c10::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string listed(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < 12; ++i) out += "\n  " + items[i];
  if (items.size() > 12) out += "\n  ... (" + std::to_string(items.size()) + " in all)";
  return out;
}

InitialWeights load_initial_weights(torch::nn::Module& model, const std::string& path,
                                    bool strict) {
  InitialWeights result;
  result.path = path;
  std::string bytes;
  try {
    bytes = fs::read_file(path);
  } catch (const std::exception& e) {
    throw ConfigError("model.init_from: cannot read " + path + ": " + e.what());
  }
  result.xxh3 = xxh3_hex(bytes);
  NamedTensors file;
  try {
    file = unpickle_tensors(bytes, path);
  } catch (const std::exception& e) {
    throw ConfigError(
        "model.init_from: " + path +
        " is not a state_dict (a torch.save of a dict of name -> tensor): " + e.what());
  }
  std::map<std::string, at::Tensor> by_name(file.begin(), file.end());
  const auto target = state_dict(model);
  std::vector<std::string> mismatched, missing;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // model tensor <- file tensor
  for (const auto& [name, tensor] : target) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (!is_lora_adapter(name)) missing.push_back(name);
    } else if (it->second.sizes() != tensor.sizes()) {
      mismatched.push_back(name + ": the file has " + shape_text(it->second.sizes()) +
                           ", the model " + shape_text(tensor.sizes()));
    } else {
      copies.emplace_back(tensor, it->second);
    }
    if (it != by_name.end()) by_name.erase(it);
  }
  bool lora_file = false;
  for (const auto& [name, tensor] : file) {
    if (!by_name.count(name)) continue;
    result.unused.push_back(name + " " + shape_text(tensor.sizes()));
    lora_file = lora_file || is_lora_adapter(name);
  }
  result.not_loaded = mismatched;
  result.not_loaded.insert(result.not_loaded.end(), missing.begin(), missing.end());
  const std::string hint =
      lora_file ? "\n(the file holds LoRA adapters: `gpurun export CKPT --to FILE --merge-lora` "
                  "writes the base model's weights with them merged)"
                : "";
  if (copies.empty() && !target.empty())
    throw ConfigError("model.init_from: no tensor of " + path +
                      " matches the model by name and shape (the model's are named like " +
                      target.front().first + ", the file's like " +
                      (file.empty() ? std::string("nothing: it is empty") : file.front().first) +
                      ")" + hint);
  if (strict && (!result.not_loaded.empty() || !result.unused.empty())) {
    std::string message = "model.init_from: " + path + " does not fit the model";
    if (!mismatched.empty()) message += "; shapes differ:" + listed(mismatched);
    if (!missing.empty()) message += "\nmissing from the file:" + listed(missing);
    if (!result.unused.empty())
      message += "\nin the file but not in the model:" + listed(result.unused);
    throw ConfigError(message + "\n(model.init_strict: false loads the tensors that match)" + hint);
  }
  c10::NoGradGuard no_grad;
  for (auto& [to, from] : copies) to.copy_(from);
  result.loaded = static_cast<int64_t>(copies.size());
  return result;
}

}  // namespace gpurun

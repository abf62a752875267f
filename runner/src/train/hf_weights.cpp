#include "train/hf_weights.h"

#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/format/safetensors.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "model/fine_tune.h"
#include "model/hf_config.h"
#include "train/init_weights.h"
#include "util/fs.h"
#include "util/hash.h"

namespace gpurun {
namespace {

using json = nlohmann::json;

/// The folder's safetensors files, opened and checked, and where each tensor is.
struct Folder {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, std::pair<const SafetensorsFile*, const SafetensorsEntry*>> tensors;
};

Folder open_folder(const std::string& folder) {
  Folder f;
  const std::string single = folder + "/model.safetensors";
  const std::string index = folder + "/model.safetensors.index.json";
  if (fs::exists(index)) {
    json j;
    try {
      j = json::parse(fs::read_file(index));
    } catch (const std::exception& e) {
      throw ConfigError(index + " is not JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw ConfigError(index + ": weight_map: missing; expected {TENSOR: FILE, ...}");
    std::map<std::string, std::vector<std::string>> names_of;  // file -> its tensors
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw ConfigError(index + ": weight_map." + name + ": expected a file name in " + folder +
                          ", got " + file.dump());
      names_of[file.get<std::string>()].push_back(name);
    }
    for (const auto& [file, names] : names_of) {
      const std::string path = folder + "/" + file;
      if (!fs::exists(path))
        throw ConfigError(index + ": weight_map." + names.front() + ": the shard " + file +
                          " is not in " + folder + " (" + std::to_string(names.size()) +
                          " tensors are listed in it; was the download cut short?)");
      f.files.push_back(std::make_unique<SafetensorsFile>(path));
      const SafetensorsFile& opened = *f.files.back();
      for (const std::string& name : names) {
        const SafetensorsEntry* entry = opened.find(name);
        if (!entry)
          throw ConfigError(index + ": weight_map." + name + ": the shard " + path +
                            " does not hold it");
        f.tensors[name] = {&opened, entry};
      }
    }
  } else if (fs::exists(single)) {
    f.files.push_back(std::make_unique<SafetensorsFile>(single));
    for (const SafetensorsEntry& e : f.files.back()->entries())
      f.tensors[e.name] = {f.files.back().get(), &e};
  } else {
    throw ConfigError("model.path: " + folder +
                      " holds no weights (model.safetensors, or model.safetensors.index.json "
                      "with its shards): a run starts from them. `gpurun plan` needs "
                      "config.json alone; a PyTorch .bin checkpoint can be converted with "
                      "transformers' save_pretrained(..., safe_serialization=True)");
  }
  return f;
}

/// The model's tensors paired with the folder's; throws for a missing one or another shape.
std::vector<std::pair<at::Tensor, std::pair<const SafetensorsFile*, const SafetensorsEntry*>>>
match(const torch::nn::Module& model, const Folder& f, const std::string& folder, bool log) {
  std::vector<std::pair<at::Tensor, std::pair<const SafetensorsFile*, const SafetensorsEntry*>>>
      pairs;
  std::vector<std::string> missing, mismatched;
  std::set<std::string> used;
  for (const auto& [name, tensor] : state_dict(model)) {
    if (is_lora_adapter(name)) continue;
    const auto it = f.tensors.find(name);
    if (it == f.tensors.end()) {
      missing.push_back(name + " " + shape_text(tensor.sizes()));
      continue;
    }
    used.insert(name);
    const SafetensorsEntry& e = *it->second.second;
    if (c10::IntArrayRef(e.shape) != tensor.sizes()) {
      mismatched.push_back(name + ": " + it->second.first->path() + " has " + shape_text(e.shape) +
                           ", the model (config.json) " + shape_text(tensor.sizes()));
      continue;
    }
    if (!at::isFloatingType(e.dtype) && e.dtype != tensor.scalar_type())
      mismatched.push_back(name + ": " + it->second.first->path() + " holds " +
                           safetensors_dtype(e.dtype) + ", the model " +
                           hf_dtype_name(tensor.scalar_type()));
    pairs.emplace_back(tensor, it->second);
  }
  if (!missing.empty() || !mismatched.empty()) {
    std::string message = "model.path: the weights in " + folder + " do not fit its config.json";
    if (!missing.empty())
      message += "\nmissing from every safetensors file there:" + listed(missing);
    if (!mismatched.empty()) message += "\nwith another shape or dtype:" + listed(mismatched);
    throw ConfigError(message);
  }
  std::vector<std::string> unused;
  for (const auto& [name, where] : f.tensors)
    if (!used.count(name)) unused.push_back(name + " (" + where.first->path() + ")");
  if (!unused.empty() && log)
    spdlog::warn("model.path: {} tensors of {} are not part of the model and are not read:{}",
                 unused.size(), folder, listed(unused));
  return pairs;
}

int64_t status_field(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size())) * 1024;
  return 0;
}

}  // namespace

int64_t resident_bytes() { return status_field("VmRSS"); }
int64_t resident_peak_bytes() { return status_field("VmHWM"); }

void check_hf_weights(const torch::nn::Module& model, const std::string& folder) {
  const Folder f = open_folder(folder);
  match(model, f, folder, /*log=*/true);
}

json load_hf_weights(torch::nn::Module& model, const std::string& folder) {
  const auto start = std::chrono::steady_clock::now();
  const Folder f = open_folder(folder);
  auto pairs = match(model, f, folder, /*log=*/false);  // check_hf_weights() said it
  // In the files' order: each file is read front to back.
  std::map<std::pair<const SafetensorsFile*, int64_t>, size_t> order;
  for (size_t i = 0; i < pairs.size(); ++i)
    order[{pairs[i].second.first, pairs[i].second.second->begin}] = i;
  Xxh3 headers;
  json files = json::array();
  for (const auto& file : f.files) {
    files.push_back(file->path());
    headers.update(file->path().data(), file->path().size());
    for (const SafetensorsEntry& e : file->entries()) {
      headers.update(e.name.data(), e.name.size());
      const int64_t where[3] = {static_cast<int64_t>(e.dtype), e.begin, e.end};
      headers.update(where, sizeof where);
    }
  }
  std::map<c10::ScalarType, int64_t> bytes_of;
  int64_t bytes = 0;
  {
    c10::NoGradGuard no_grad;
    std::vector<size_t> in_order;
    for (const auto& [key, i] : order) in_order.push_back(i);
    if (!in_order.empty())
      pairs[in_order[0]].second.first->prefetch(*pairs[in_order[0]].second.second);
    for (size_t k = 0; k < in_order.size(); ++k) {
      const size_t i = in_order[k];
      at::Tensor& to = pairs[i].first;
      const SafetensorsFile& file = *pairs[i].second.first;
      const SafetensorsEntry& entry = *pairs[i].second.second;
      // The next tensor's pages are read while this one is copied.
      if (k + 1 < in_order.size())
        pairs[in_order[k + 1]].second.first->prefetch(*pairs[in_order[k + 1]].second.second);
      to.copy_(file.view(entry));  // converts the dtype, and copies to the device
      file.release(entry);
      bytes += entry.end - entry.begin;
      bytes_of[entry.dtype] += entry.end - entry.begin;
    }
  }
  c10::ScalarType dtype = c10::ScalarType::Float;
  int64_t most = -1;
  for (const auto& [type, n] : bytes_of)
    if (at::isFloatingType(type) && n > most) most = n, dtype = type;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {{"path", folder},
          {"files", files},
          {"header_xxh3", headers.hex()},
          {"dtype", hf_dtype_name(dtype)},
          {"loaded", static_cast<int64_t>(pairs.size())},
          {"bytes", bytes},
          {"seconds", seconds},
          {"resident_peak_bytes", resident_peak_bytes()}};
}

}  // namespace gpurun

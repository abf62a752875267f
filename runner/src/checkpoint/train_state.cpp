#include "checkpoint/train_state.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/Dict.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>

#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "util/rng.h"

namespace gpurun {

std::string pickle_tensors(const NamedTensors& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor);
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  return std::string(bytes.begin(), bytes.end());
}

NamedTensors unpickle_tensors(const std::string& bytes, const std::string& what) {
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    throw ResumeError(what + " is not a pickled tensor dict: " + e.what());
  }
  if (!value.isGenericDict()) throw ResumeError(what + " is not a pickled tensor dict");
  NamedTensors out;
  for (const auto& entry : value.toGenericDict())
    out.emplace_back(entry.key().toStringRef(), entry.value().toTensor());
  return out;
}

std::string cpu_capability() {
  const std::string config = at::show_config();
  const std::string key = "CPU capability usage: ";
  auto pos = config.find(key);
  if (pos == std::string::npos) return "unknown";
  auto end = config.find('\n', pos);
  return config.substr(pos + key.size(), end - pos - key.size());
}

namespace {
std::string rng_key(int rank) {
  return rank == 0 ? "cpu_rng_state" : "cpu_rng_state.rank" + std::to_string(rank);
}
}  // namespace

CheckpointSnapshot capture_state(const torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                 CheckpointMeta meta,
                                 const std::vector<at::Tensor>& rank_rng_states) {
  NamedTensors weights;
  for (const auto& [name, tensor] : state_dict(model))
    weights.emplace_back(name, tensor.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
  std::ostringstream optim;
  {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to(optim);
  }
  NamedTensors trainer{{rng_key(0), rng_state(default_generator(at::kCPU))}};
  for (size_t r = 0; r < rank_rng_states.size(); ++r)
    trainer.emplace_back(rng_key(static_cast<int>(r) + 1), rank_rng_states[r]);
  meta.model_digest = model_digest(model);
  meta.threads = at::get_num_threads();
  meta.cpu_capability = cpu_capability();
  CheckpointSnapshot snapshot;
  snapshot.meta = std::move(meta);
  snapshot.files.emplace_back("model.pt", pickle_tensors(weights));
  snapshot.files.emplace_back("optim.pt", optim.str());
  snapshot.files.emplace_back("trainer.pt", pickle_tensors(trainer));
  return snapshot;
}

bool restore_state(const LoadedCheckpoint& checkpoint, torch::nn::Module& model,
                   torch::optim::Optimizer& optimizer, int rank) {
  const std::string& where = checkpoint.info.path;
  NamedTensors saved = unpickle_tensors(checkpoint.file("model.pt"), where + "/model.pt");
  std::map<std::string, at::Tensor> by_name(saved.begin(), saved.end());
  {
    at::NoGradGuard no_grad;
    for (auto& [name, tensor] : state_dict(model)) {
      auto it = by_name.find(name);
      if (it == by_name.end()) throw ResumeError(where + "/model.pt has no tensor " + name);
      if (it->second.sizes() != tensor.sizes())
        throw ResumeError(where + "/model.pt: " + name + " has shape " +
                          c10::str(it->second.sizes()) + ", the model expects " +
                          c10::str(tensor.sizes()));
      tensor.copy_(it->second);
    }
  }
  {
    // Loaded to host memory first; optimizer.load() moves state next to the parameters.
    std::istringstream in(checkpoint.file("optim.pt"));
    torch::serialize::InputArchive archive;
    archive.load_from(in, at::kCPU);
    optimizer.load(archive);
  }
  for (const auto& [name, tensor] :
       unpickle_tensors(checkpoint.file("trainer.pt"), where + "/trainer.pt")) {
    if (name != rng_key(rank)) continue;
    set_rng_state(default_generator(at::kCPU), tensor);
    return true;
  }
  return false;
}

}  // namespace gpurun

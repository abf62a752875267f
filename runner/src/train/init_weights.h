// model.init_from: the weights a fresh run starts from (fine-tuning a pretrained model).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/util/ArrayRef.h>
#include <nlohmann/json_fwd.hpp>

namespace torch::nn {
class Module;
}

namespace gpurun {

/// What load_initial_weights() did, for the log and the manifest.
struct InitialWeights {
  std::string path;                     ///< the file as resolved
  std::string xxh3;                     ///< of the whole file, 16 hex digits
  int64_t loaded = 0;                   ///< tensors copied into the model
  std::vector<std::string> not_loaded;  ///< model tensors the file lacks or has another shape of
  std::vector<std::string> unused;      ///< file tensors the model has no place for
  nlohmann::json to_json() const;       ///< {path, xxh3, loaded, not_loaded, unused}
};

/// Copies the tensors of the state_dict file `path` into `model`'s state_dict by name: a Python
/// torch.save of a dict of name -> tensor (an OrderedDict state_dict too), a `gpurun export`,
/// or a checkpoint's model.pt. Values are converted to the model's dtype and device.
/// LoRA's adapters (model tensors "*.lora_A", "*.lora_B", which gpurun adds to a base model)
/// are never counted missing: the file is the base model's. `strict`: every other model tensor must
/// be in the file with its shape, and the file must hold nothing else; otherwise throws ConfigError
/// (exit 2) naming the keys, and the model is unchanged. Not strict: loads what matches and lists
/// the rest in the result. Throws ConfigError when the file cannot be read or is not such a dict.
/// "[3, 4]": a shape in messages.
std::string shape_text(c10::IntArrayRef shape);
/// The first 12 of `items`, one an indented line each, then how many there are in all.
std::string listed(const std::vector<std::string>& items);

InitialWeights load_initial_weights(torch::nn::Module& model, const std::string& path, bool strict);

}  // namespace gpurun

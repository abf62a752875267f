// model.name hf: the weights of a Hugging Face model folder, checked before anything is written
// and copied into the model before step 0 of a fresh run.
//
// The folder holds model.safetensors, or shards listed by model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {NAME: FILE}}), as save_pretrained writes them. The files
// are memory-mapped (checkpoint/safetensors.h) and each tensor is copied into the model's own
// (converted to its dtype, on its device) and its pages dropped before the next, so that loading
// holds the model and one tensor's pages, never the file.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace torch::nn {
class Module;
}

namespace gpurun {

/// Checks the folder's weights against `model`'s state_dict without reading a tensor: every
/// shard the index lists exists and its header is valid, every tensor the index places in a
/// file is there, and every tensor of the model (LoRA adapters aside, which gpurun adds) is in
/// some file with its shape. Tensors the model has no place for are logged (as transformers
/// does: a checkpoint may carry more, such as a tied lm_head.weight). Throws ConfigError (exit
/// 2) naming the file and the key; a folder without weights is refused with what to do.
void check_hf_weights(const torch::nn::Module& model, const std::string& folder);

/// Copies the folder's weights into `model` (check_hf_weights() first). Returns what it did for
/// the log and the manifest: {path, files, header_xxh3 (of the files' headers: names, dtypes,
/// shapes and offsets), dtype (the weights' dtype in the files: "bfloat16", ...), loaded, bytes,
/// seconds, resident_peak_bytes (the process's peak resident set when it ends, VmHWM)}.
nlohmann::json load_hf_weights(torch::nn::Module& model, const std::string& folder);

/// The process's resident set now (VmRSS) and its peak so far (VmHWM), in bytes; 0 when
/// /proc/self/status cannot be read.
int64_t resident_bytes();
int64_t resident_peak_bytes();

}  // namespace gpurun

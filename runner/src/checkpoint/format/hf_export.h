// `gpurun export CKPT --to DIR --format hf|peft` of a run of model.name hf: what Hugging Face's
// tools load.
//
// hf: a model folder as save_pretrained writes it: config.json (the input folder's, kept in the
// manifest, with its dtype key set), model.safetensors, or shards of at most `max_shard_bytes`
// named model-0000K-of-0000N.safetensors with model.safetensors.index.json ({"metadata":
// {"total_size"}, "weight_map"}), the input folder's keys (a tied lm_head omitted, as
// save_pretrained omits it); the tokenizer and generation files of the input folder are copied
// when it is still there. A LoRA run needs merge_lora (W + B A alpha/rank, in fp32).
// peft: adapter_config.json and adapter_model.safetensors as PEFT's save_pretrained writes them
// for a LoRA run: keys "base_model.model.<layer>.lora_A.weight" / "lora_B.weight", and r,
// lora_alpha, lora_dropout and target_modules (the layers' last names, or, when only some layers
// of a name were adapted, a regular expression over their full names, which PEFT matches whole).
// Every tensor is read, converted and written one at a time (checkpoint/export_state.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

#include "checkpoint/format/checkpoint_types.h"

namespace gpurun {

struct HfExport {
  std::string format = "hf";  ///< hf | peft
  bool merge_lora = false;    ///< hf: a LoRA run's adapters merged into their weights
  /// The dtype written; none: hf the input folder's weights' dtype, peft float32.
  std::optional<c10::ScalarType> dtype;
  int64_t max_shard_bytes = 5'000'000'000;  ///< save_pretrained's default "5GB"
};

/// Writes `checkpoint` (verified) to the folder `to`, which must not exist or be empty: built
/// in a temporary folder beside it and renamed into place. Returns the line export prints.
/// Throws ConfigError (exit 2) for a run that is not model.name hf, peft of a run without LoRA,
/// hf of a LoRA run without merge_lora, or a `to` that holds files; DamagedCheckpointError when
/// model.pt does not match model_digest; IoError when a file cannot be read or written.
std::string export_hf(const LoadedCheckpoint& checkpoint, const std::string& to,
                      const HfExport& options);

}  // namespace gpurun

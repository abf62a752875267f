// `gpurun export CKPT_DIR --to FILE` (docs/architecture.md, "Command line"): the trained model of a
// checkpoint, in a form Python loads without gpurun.
//
// CKPT_DIR is a checkpoint root or one ckpt-* folder. A root means its newest checkpoint (of the
// root and of its local tier on this machine), whose checksums must verify: when it does not,
// or when a newer one was set aside as damaged by a resume, the export is refused, naming it
// and the newest checkpoint that verifies; `step` (--step N) or the folder's path exports an
// older one; `best` (--best) the best one by checkpoint.keep_best's metric (the newest
// checkpoint's config names it) that verifies, one that does not skipped with a warning for the
// next best. Nothing is renamed: a run may still be writing there. FILE receives, written
// atomically (an existing FILE is replaced; a directory is refused):
//   - for a built-in or plugin model, the state_dict: torch.load(FILE) in Python gives a plain
//     dict name -> tensor (the checkpoint's model.pt, verified);
//   - for a TorchScript model (model.torchscript), the scripted module with the trained
//     parameters and buffers: torch.jit.load(FILE) gives the trained module. Its code comes
//     from the module file the run was trained from (the path recorded in the manifest, which
//     must still exist); its weights from the checkpoint.
// With `merge_lora`, a checkpoint of a run with model.lora is written as the base model's
// state_dict: each adapter's B A (alpha / rank) added into its layer's weight
// (model/fine_tune.h, merge_lora_adapters()), the adapters left out. A checkpoint without adapters
// is refused (ConfigError), as is a TorchScript model.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

namespace gpurun {

/// Exports as described above and prints one line to `out` naming the checkpoint, its global
/// step and model_digest, FILE and the format; returns 0. Throws ConfigError (exit 2) for a
/// CKPT_DIR that is missing or not a directory, a FILE that is a directory (or ends in '/'), a
/// FILE whose directory does not exist, `step` with a ckpt-* folder, or a TorchScript module
/// file that is gone, `best` with `step` or a folder, or `best` where no keep_best metric is
/// configured or recorded; ResumeError (exit 3) when the newest checkpoint does not verify (or a
/// newer one was set aside), there is none, the given folder or step's checkpoint does not
/// verify or does not exist (with `best`: no ranked one verifies), or its weights do not match its
/// model_digest or the module; IoError (exit 1) when reading or writing fails. `format` hf or peft
/// writes the folder `to` (checkpoint/hf_export.h) in `dtype` ("": the format's default), hf in
/// files of at most `max_shard_bytes`.
int export_command(const std::string& ckpt_dir, const std::string& to, std::ostream& out,
                   bool merge_lora = false, std::optional<int64_t> step = std::nullopt,
                   const std::string& format = "pt", const std::string& dtype = "",
                   int64_t max_shard_bytes = 5'000'000'000, bool best = false);

}  // namespace gpurun

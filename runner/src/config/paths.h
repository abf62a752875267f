// Where a relative path of run.yaml (or of --set) points: the one rule, in full in
// docs/architecture.md, "Paths in run.yaml".
//
//   Inputs, files gpurun reads that travel with the config (model.plugin, model.torchscript,
//   model.init_from, data.path, data.eval_path): relative to the folder of run.yaml.
//   Places gpurun writes on this machine (data.stage_dir, checkpoint.local_dir): relative to
//   the working directory, as --ckpt and --run-dir are.
//
// The config keeps what the user wrote (config_hash covers it, so a run's hash does not depend
// on where it was started from); the resolved path is what gpurun opens and what its errors
// name. data.path and data.eval_path used to resolve against the working directory: a
// relative one found only there is still read from there, with a warning, so that a run
// started then resumes from the same working directory; found in both places (two different
// files) it is refused as ambiguous.
#pragma once

#include <string>

#include "gpurun/config.h"

namespace gpurun {

/// The path the input key `key` (data.path, data.eval_path, model.plugin, ...) names: `path`
/// unchanged when empty or absolute, otherwise by the rule above. `log`: say when the old
/// rule was taken (once per process is enough: rank 0). Throws ConfigError naming both places
/// when a data path is found in both.
std::string resolve_input_path(const RunConfig& config, const std::string& key,
                               const std::string& path, bool log = true);

/// config.data with data.path and data.eval_path resolved (resolve_input_path()): what the data
/// set factories receive, so that their errors name the file they tried.
DataConfig resolved_data(const RunConfig& config, bool log = true);

}  // namespace gpurun

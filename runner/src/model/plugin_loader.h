// Loading a user's plugin .so (plugin.h) and describing where a run's model comes from, so
// that a checkpoint records which plugin or TorchScript file it was trained with.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpurun/config.h"

namespace gpurun {

class Registry;

/// What load_plugin() found.
struct PluginInfo {
  std::string path;           ///< as given to dlopen
  int abi_version = 0;        ///< gpurun_plugin_abi_version(), equal to the host's
  std::string torch_version;  ///< gpurun_plugin_torch_version(), or "" when not exported
};

/// dlopen()s `path` (RTLD_NOW | RTLD_LOCAL; the handle is never closed), checks its ABI and
/// LibTorch versions and calls gpurun_plugin_init(GPURUN_PLUGIN_ABI_VERSION, &registry).
/// Throws ConfigError (exit 2) for a path that is missing or that dlopen cannot load (with
/// dlerror()'s text), or when the plugin's registration throws (with its message);
/// AbiError (exit 3) when the plugin was built for another ABI version or LibTorch
/// major.minor (naming both versions), lacks gpurun_plugin_abi_version or gpurun_plugin_init
/// (naming the symbol and the file), needs a symbol this gpurun does not have, or its init
/// returns non-zero.
PluginInfo load_plugin(const std::string& path, Registry& registry);

/// Loads config.model.plugin, resolved with config_path(), when it is set; else does nothing.
/// Throws what load_plugin throws.
void load_configured_plugin(const RunConfig& config, Registry& registry);

/// Where the model comes from when it is not built in: for model.plugin and model.torchscript
/// {"kind": "plugin"|"torchscript", "path": resolved path, "xxh3": of the file's bytes} plus
/// "abi_version" for a plugin; an empty object for a built-in model. Recorded in every
/// checkpoint's manifest (extra.model_source). Throws ConfigError when the file is unreadable.
nlohmann::json describe_model_source(const RunConfig& config);

/// Compares the model source recorded in a checkpoint with this run's (both from
/// describe_model_source): a different file digest or ABI version is described in one line
/// ("" when they agree or when either side is empty). The config hash already refuses a
/// changed model.plugin or model.torchscript setting, and restoring refuses changed tensor
/// names or shapes; a rebuilt file with the same tensors resumes with this as a warning.
std::string compare_model_source(const nlohmann::json& saved, const nlohmann::json& current);

}  // namespace gpurun

// The plugin ABI: how a user's shared library adds models, datasets, losses and hooks to gpurun.
//
// A plugin is a .so named in run.yaml (`model.plugin: build/libmy_models.so`, with
// `model.name` naming one of its models). gpurun dlopen()s it (RTLD_NOW | RTLD_LOCAL) and looks
// up C symbols, like ggml's backend registry and flashlight's fl/common/Plugin.h:
//
//   int         gpurun_plugin_abi_version(void);   read first: must equal the host's
//                                                  GPURUN_PLUGIN_ABI_VERSION, else exit 3
//   const char* gpurun_plugin_torch_version(void); optional: the LibTorch "MAJOR.MINOR.PATCH"
//                                                  it was built against; major.minor must match
//   int         gpurun_plugin_init(int abi_version, gpurun::Registry* registry);
//                                                  registers models, datasets, losses (train.loss),
//                                                  epoch hooks and step hooks; 0 on success
//
// The symbols are C, but what crosses them is C++ (Registry, SegmentedModel, std::function,
// LibTorch tensors): a plugin must be built with the same compiler family and standard
// library, against the same gpurun headers (the ABI version below) and the same LibTorch as
// the gpurun that loads it. Its gpurun and LibTorch symbols resolve to the host's single copy
// of libgpurun_core.so and libtorch, so a plugin sees the host's registry, allocator, RNG and
// memory meter. A plugin is never unloaded (its code backs the models it created).
//
// Writing one (see examples/custom_plugin/):
//
//   #include <gpurun/model.h>
//   #include <gpurun/plugin.h>
//   #include <gpurun/registry.h>
//
//   GPURUN_PLUGIN(registry) {
//     registry.add_model("tiny_mlp", [](const gpurun::ModelConfig& config,
//                                       const std::vector<int64_t>& input_shape,
//                                       int64_t num_classes) { ... return model; });
//   }
//
// The body may throw (e.g. Registry's std::logic_error for a name registered twice); gpurun
// reports the message and exits 2.
#pragma once

#include <torch/version.h>  // TORCH_VERSION: what the plugin is compiled against

/// Bumped whenever a type that crosses the plugin boundary changes layout or meaning:
/// Registry's factory signatures, ModelConfig, DataConfig, Dataset, DatasetSplits,
/// SegmentedModel. A plugin built for another version is refused (exit 3) before any of its
/// code runs.
#define GPURUN_PLUGIN_ABI_VERSION 3

namespace gpurun {
class Registry;
}

#define GPURUN_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

/// The plugin's ABI version; the host reads it before calling anything else.
GPURUN_PLUGIN_EXPORT int gpurun_plugin_abi_version(void);
/// The LibTorch version the plugin was compiled against, "MAJOR.MINOR.PATCH".
GPURUN_PLUGIN_EXPORT const char* gpurun_plugin_torch_version(void);
/// Registers the plugin's models and datasets in `*registry`. `abi_version` is the host's;
/// returns 0 on success, 1 when `abi_version` is not the plugin's. May throw std::exception.
GPURUN_PLUGIN_EXPORT int gpurun_plugin_init(int abi_version, gpurun::Registry* registry);

/// Defines the three entry points; the braces that follow are the body of a function
/// `void (gpurun::Registry& REGISTRY)` that registers the plugin's models and datasets.
/// Use it once per plugin, at namespace scope.
#define GPURUN_PLUGIN(REGISTRY)                                                                  \
  static void gpurun_plugin_register_(::gpurun::Registry& REGISTRY);                             \
  GPURUN_PLUGIN_EXPORT int gpurun_plugin_abi_version(void) { return GPURUN_PLUGIN_ABI_VERSION; } \
  GPURUN_PLUGIN_EXPORT const char* gpurun_plugin_torch_version(void) { return TORCH_VERSION; }   \
  GPURUN_PLUGIN_EXPORT int gpurun_plugin_init(int abi_version, ::gpurun::Registry* registry) {   \
    if (abi_version != GPURUN_PLUGIN_ABI_VERSION || registry == nullptr) return 1;               \
    gpurun_plugin_register_(*registry);                                                          \
    return 0;                                                                                    \
  }                                                                                              \
  static void gpurun_plugin_register_(::gpurun::Registry& REGISTRY)

// The built-in models and datasets, registered by name. Registration is an explicit call,
// not static initialisers, which a linker drops from static libraries.
#pragma once

namespace gpurun {
class Registry;
/// Adds models mlp and cnn (models.cpp) and dataset idx (idx_dataset.cpp) to `registry`.
void register_builtin_plugins(Registry& registry);
void register_builtin_models(Registry& registry);
void register_builtin_datasets(Registry& registry);
}  // namespace gpurun

#include "builtin.h"
#include "data/builtin_datasets.h"

namespace gpurun {
void register_builtin_plugins(Registry& registry) {
  register_builtin_models(registry);
  register_builtin_datasets(registry);
  register_sample_hook(registry);
}
}  // namespace gpurun

#include "data/builtin_datasets.h"

namespace gpurun {

void register_builtin_datasets(Registry& registry) {
  register_idx_dataset(registry);
  register_csv_dataset(registry);
  register_text_dataset(registry);
  register_image_folder_dataset(registry);
  register_tokens_dataset(registry);
  register_synthetic_dataset(registry);
}

}  // namespace gpurun

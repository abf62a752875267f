// The data sets gpurun ships, registered by name like a plugin's (registry.h). idx, csv and
// text read their files whole when the run sets up, into a TensorDataset (gpurun/dataset.h);
// image_folder lists its files then and decodes each sample when it is asked for; tokens maps
// its file and reads the windows a batch asks for.
#pragma once

#include <string>

#include "gpurun/config.h"

namespace gpurun {
class Registry;

/// Adds idx, csv, text, image_folder, tokens and synthetic to `registry`.
void register_builtin_datasets(Registry& registry);

/// idx: MNIST-family IDX files (idx_dataset.cpp).
void register_idx_dataset(Registry& registry);
/// csv: a table of features and a label column (csv_dataset.cpp).
void register_csv_dataset(Registry& registry);
/// text: characters of a UTF-8 file as token ids (text_dataset.cpp).
void register_text_dataset(Registry& registry);
/// image_folder: JPEG and PNG files in one folder per class (image_folder.h).
void register_image_folder_dataset(Registry& registry);
/// tokens: a memory-mapped binary file of token ids, raw or llm.c's (tokens_dataset.cpp).
void register_tokens_dataset(Registry& registry);
/// The tokens data set's eval file: data.eval_path, else a val.bin beside data.path, else ""
/// (the last data.eval_fraction of data.path). data_stage stages it with data.path.
std::string tokens_eval_file(const DataConfig& data);
/// synthetic: random samples of a given shape, for tests and plans (synthetic_dataset.cpp).
void register_synthetic_dataset(Registry& registry);

}  // namespace gpurun

#include "train/resume.h"

#include <ATen/Parallel.h>

#include <spdlog/spdlog.h>

#include "checkpoint/train_state.h"
#include "gpurun/errors.h"
#include "model/plugin_loader.h"
#include "train/init_weights.h"

namespace gpurun {

void check_resumable(const RunConfig& config, const LoadedCheckpoint& loaded) {
  RunConfig saved = config_from_json(loaded.meta.config);
  if (saved.train.precision == "auto") saved.train.precision = config.train.precision;
  if (config_hash(saved) == config_hash(config)) return;
  std::string keys;
  for (const auto& k : changed_training_keys(saved, config)) keys += "\n  " + k;
  throw ResumeError("cannot resume " + loaded.info.path +
                    ": training keys differ from the checkpoint's config:" + keys +
                    "\n(extending train.epochs is allowed; otherwise use a new --ckpt "
                    "directory)");
}

nlohmann::json load_init_from(torch::nn::Module& model, const RunConfig& config) {
  const InitialWeights init = load_initial_weights(
      model, config_path(config, config.model.init_from), config.model.init_strict);
  spdlog::info("model.init_from: loaded {} tensors from {} (xxh3 {})", init.loaded, init.path,
               init.xxh3);
  if (!init.not_loaded.empty() || !init.unused.empty()) {
    std::string rest;
    for (const std::string& k : init.not_loaded) rest += "\n  not loaded (kept its init): " + k;
    for (const std::string& k : init.unused) rest += "\n  in the file, not in the model: " + k;
    spdlog::warn(
        "model.init_strict false: {} of the model's tensors were not loaded and {} of "
        "the file's were not used:{}",
        init.not_loaded.size(), init.unused.size(), rest);
  }
  return init.to_json();
}

void log_resume_differences(const LoadedCheckpoint& loaded, const RunConfig& config,
                            const ResumingProcess& process) {
  const CheckpointMeta& meta = loaded.meta;
  const bool first = process.rank == 0;
  if (meta.threads != at::get_num_threads() || meta.cpu_capability != cpu_capability())
    spdlog::warn(
        "checkpoint was written with {} threads and CPU capability {}; this run uses "
        "{} and {}: results will differ in the last bits",
        meta.threads, meta.cpu_capability, at::get_num_threads(), cpu_capability());
  if (!process.rng_restored)
    spdlog::warn(
        "rank {}: {} was written by {} rank(s) and holds no random state for this "
        "rank; its dropout stream starts from the seed (the run is no longer "
        "bit-identical to one that kept its world size)",
        process.rank, loaded.info.path, meta.world_size);
  const std::string changed = compare_model_source(
      meta.extra.value("model_source", nlohmann::json::object()), process.model_source);
  if (!changed.empty())
    spdlog::warn(
        "{}; its tensors have the same names and shapes, so training resumes, but "
        "the model's code may have changed",
        changed);
  if (!config.model.init_from.empty() && first)
    spdlog::info("model.init_from {} is not read: every weight comes from the checkpoint",
                 config.model.init_from);
  const std::string trained_in = meta.extra.value("precision", std::string("fp32"));
  if (trained_in != precision_name(process.precision.precision) && first)
    spdlog::info(
        "the checkpoint was trained in {} (train.precision {}); training continues in "
        "{} ({})",
        trained_in,
        meta.config.value("train", nlohmann::json::object())
            .value("precision", std::string("fp32")),
        precision_name(process.precision.precision), process.precision.reason);
  // The gradients are now summed over another set of shards.
  if (meta.world_size != process.world_size && first)
    spdlog::warn(
        "the checkpoint was written by {} rank(s), this run has {}: the global batch "
        "and the position in the epoch's order are kept, so every sample of the epoch "
        "is seen exactly once, but the run is not bit-identical to one that kept {} "
        "rank(s) (gradients are summed in another order: the last bits differ)",
        meta.world_size, process.world_size, meta.world_size);
}

}  // namespace gpurun

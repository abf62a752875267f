#include "train/resume.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <set>

#include <spdlog/spdlog.h>

#include "checkpoint/format/train_state.h"
#include "config/paths.h"
#include "gpurun/errors.h"
#include "model/hf_config.h"
#include "model/plugin_loader.h"
#include "optim/lr_schedule.h"
#include "optim/torch_optimizer.h"
#include "train/hf_weights.h"
#include "train/init_weights.h"
#include "util/units.h"

namespace gpurun {

namespace {

/// Logs, on rank 0, what another train.epochs than the checkpoint's does to the run: its total
/// of optimizer steps, and the learning-rate curve where the schedule depends on that total.
void log_run_length_change(const LoadedCheckpoint& loaded, const RunConfig& config,
                           int64_t steps_per_epoch) {
  const int64_t was_epochs = config_from_json(loaded.meta.config).train.epochs;
  if (was_epochs == config.train.epochs || steps_per_epoch <= 0) return;
  const int64_t step = loaded.meta.global_step;
  const int64_t was_total = was_epochs * steps_per_epoch;
  const int64_t total = config.train.epochs * steps_per_epoch;
  const std::string change = fmt::format(
      "train.epochs is {} here and was {} in {}: the run has {} optimizer steps instead of {}",
      config.train.epochs, was_epochs, loaded.info.path, total, was_total);
  if (total <= step) {
    spdlog::info("{}; the checkpoint has done all {} of them", change, step);
    return;
  }
  const double was_lr = learning_rate(config.optim, config.schedule, step, was_total);
  const double lr = learning_rate(config.optim, config.schedule, step, total);
  if (config.schedule.name == "cosine")
    spdlog::warn(
        "{}; schedule.name cosine decays over the total, so the learning-rate curve changes "
        "from global step {} on (its next step's learning rate is {:.6g}, {:.6g} under the old "
        "total) and the run is no longer the one the checkpoint was training",
        change, step, lr, was_lr);
  else
    spdlog::info("{}; the learning rate (schedule.name {}) does not depend on the total", change,
                 config.schedule.name);
}

}  // namespace

int64_t steps_per_epoch(const RunConfig& config, int64_t train_samples) {
  const int64_t batch = std::max<int64_t>(1, config.train.batch_size);
  return (train_samples + batch - 1) / batch;
}

void check_hf_config(const RunConfig& config, const LoadedCheckpoint& loaded) {
  if (config.model.name != "hf") return;
  const nlohmann::json source = loaded.meta.extra.value("init_from", nlohmann::json::object());
  if (source.value("kind", "") != "hf" || !source.contains("config")) return;
  const std::string folder = config_path(config, config.model.path);
  const nlohmann::json now = read_hf_config(folder).json;
  const nlohmann::json& was = source["config"];
  // What builds no other model: the file's own bookkeeping, the dtype the weights were saved in
  // (the run's precision decides the model's), and the generation's special tokens.
  static const std::set<std::string> kIgnored = {
      "transformers_version", "_name_or_path", "torch_dtype", "dtype", "use_cache",
      "bos_token_id",         "eos_token_id",  "pad_token_id"};
  std::string changes;
  std::set<std::string> keys;
  for (const auto& [key, value] : now.items()) keys.insert(key);
  for (const auto& [key, value] : was.items()) keys.insert(key);
  for (const std::string& key : keys) {
    if (kIgnored.count(key)) continue;
    const nlohmann::json a = was.value(key, nlohmann::json()), b = now.value(key, nlohmann::json());
    if (a != b) changes += "\n  " + key + ": " + a.dump() + " -> " + b.dump();
  }
  if (!changes.empty())
    throw ResumeError(
        "cannot resume " + loaded.info.path + ": " + folder +
        "/config.json differs from the one the checkpoint's run started from:" + changes +
        "\n(the model would be another; restore the config.json, or start a new "
        "--ckpt directory from this folder)");
}

void check_resumable(const RunConfig& config, const LoadedCheckpoint& loaded,
                     int64_t steps_per_epoch) {
  RunConfig saved = config_from_json(loaded.meta.config);
  if (saved.train.precision == "auto") saved.train.precision = config.train.precision;
  if (config_hash(saved) != config_hash(config)) {
    std::string keys;
    for (const auto& k : changed_training_keys(saved, config)) keys += "\n  " + k;
    throw ResumeError("cannot resume " + loaded.info.path +
                      ": training keys differ from the checkpoint's config:" + keys +
                      "\n(extending train.epochs is allowed; otherwise use a new --ckpt "
                      "directory)");
  }
  check_hf_config(config, loaded);
  // Lowering train.epochs below the checkpoint would "finish" at once with a step past the
  // total and no final checkpoint of the shorter run: there is no such run to finish.
  const CheckpointMeta& meta = loaded.meta;
  const int64_t total = config.train.epochs * steps_per_epoch;
  if (steps_per_epoch <= 0 || meta.global_step <= total) return;
  const int64_t fewest = meta.epoch + (meta.position_in_epoch > 0 ? 1 : 0);
  throw ResumeError(fmt::format(
      "cannot resume {}: train.epochs {} gives {} optimizer steps ({} per epoch), but the "
      "checkpoint is at global step {} ({}); train.epochs must be at least {} to continue it, "
      "or use a new --ckpt directory to train a shorter run",
      loaded.info.path, config.train.epochs, total, steps_per_epoch, meta.global_step,
      meta.position_in_epoch > 0
          ? fmt::format("in epoch {}, {} samples into it", meta.epoch, meta.position_in_epoch)
          : fmt::format("after {} epochs", meta.epoch),
      fewest));
}

nlohmann::json check_data(const LoadedCheckpoint& loaded, const DataFingerprint& now, bool allow) {
  const nlohmann::json& saved = loaded.meta.extra.value("data", nlohmann::json());
  if (!saved.is_object()) return nullptr;  // an older gpurun's checkpoint
  DataFingerprint before;
  try {
    before = DataFingerprint::from_json(saved);
  } catch (const nlohmann::json::exception&) {
    spdlog::warn("{}: its data fingerprint is unreadable; the data is not compared",
                 loaded.info.path);
    return nullptr;
  }
  const DataChange change = compare_data(before, now);
  if (!change.touched.empty()) {
    std::string paths;
    for (const std::string& t : change.touched) paths += (paths.empty() ? "" : ", ") + t;
    spdlog::warn(
        "the data's files are as the checkpoint's run found them, by name and size, but newer "
        "({}): a copy made anew on this machine is the same data; a file rewritten in place to "
        "the same size is not, and would make this resume another run",
        paths);
  }
  if (change.changes.empty()) return nullptr;
  std::string lines;
  for (const std::string& c : change.changes) lines += "\n  " + c;
  if (!allow)
    throw ResumeError("cannot resume " + loaded.info.path +
                      ": the data changed since the checkpoint was written:" + lines +
                      "\n(the data order, the epoch's length and the schedule follow the data; "
                      "resume over it with --allow-data-change, or restore the data)");
  spdlog::warn("--allow-data-change: resuming {} over changed data:{}", loaded.info.path, lines);
  return {{"path", loaded.info.path}, {"changes", change.changes}};
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

nlohmann::json load_hf_model(torch::nn::Module& model, const RunConfig& config) {
  const std::string folder = config_path(config, config.model.path);
  nlohmann::json loaded = load_hf_weights(model, folder);
  loaded["kind"] = "hf";
  loaded["config"] = read_hf_config(folder).json;
  spdlog::info("model.path: loaded {} tensors ({}, {}) from {} in {:.1f} s",
               loaded["loaded"].get<int64_t>(), format_bytes(loaded["bytes"].get<int64_t>()),
               loaded["dtype"].get<std::string>(), folder, loaded["seconds"].get<double>());
  return loaded;
}

void log_resume_differences(const LoadedCheckpoint& loaded, const RunConfig& config,
                            const ResumingProcess& process) {
  const CheckpointMeta& meta = loaded.meta;
  const bool first = process.rank == 0;
  if (first) log_run_length_change(loaded, config, process.steps_per_epoch);
  if (meta.threads != at::get_num_threads() || meta.cpu_capability != cpu_capability())
    spdlog::warn(
        "checkpoint was written with {} thread{} and CPU capability {}; this run uses "
        "{} and {}: results will differ in the last bits",
        meta.threads, meta.threads == 1 ? "" : "s", meta.cpu_capability, at::get_num_threads(),
        cpu_capability());
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
        "rank(s): gradients are summed in another order (the last bits differ), and "
        "BatchNorm's batch statistics and dropout's random draws are per rank, over "
        "another split of the global batch (a model with either trains differently from here)",
        meta.world_size, process.world_size, meta.world_size);
}

}  // namespace gpurun

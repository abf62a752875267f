#include "cli/export_command.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpointer.h"
#include "checkpoint/format/export_state.h"
#include "checkpoint/format/hf_export.h"
#include "checkpoint/format/metric_rank.h"
#include "checkpoint/format/train_state.h"
#include "checkpoint/storage/store.h"
#include "cli/ckpt_command.h"
#include "gpurun/config.h"
#include "gpurun/errors.h"
#include "model/fine_tune.h"
#include "model/plugin_loader.h"
#include "model/torchscript_model.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/text.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

/// A checkpoint root and its local tier on this machine (checkpoint.local_dir), local first: a
/// resume prefers it on a tie, and it holds the newer state when a run stopped before its copy
/// reached the root.
std::vector<CheckpointView> tiers_of(const std::string& dir) {
  const CheckpointView root(dir);
  std::vector<CheckpointView> tiers;
  if (const std::string tier = local_tier_of(root, root.list(/*verify=*/false)); !tier.empty())
    tiers.emplace_back(tier);
  tiers.push_back(root);
  return tiers;
}

LoadedCheckpoint loaded(CheckpointInfo info) {
  CheckpointMeta meta = meta_from_manifest(info.manifest);
  return LoadedCheckpoint{std::move(info), std::move(meta), {}};
}

/// The checkpoint of global step `step` in `dir` or its local tier, its checksums verified.
LoadedCheckpoint choose_step(const std::string& dir, int64_t step) {
  std::string problems, steps;
  for (const CheckpointView& tier : tiers_of(dir)) {
    for (const CheckpointInfo& listed : tier.list(/*verify=*/false)) {
      steps += (steps.empty() ? "" : ", ") + std::to_string(listed.global_step);
      if (listed.global_step != step) continue;
      CheckpointInfo info = CheckpointView::inspect(listed.path, /*verify=*/true);
      if (info.complete) return loaded(std::move(info));
      problems += "\n  " + printable(info.path) + ": " + printable(info.problem);
    }
  }
  if (!problems.empty())
    throw ResumeError("the checkpoint of global step " + std::to_string(step) + " in " + dir +
                      " does not verify:" + problems);
  throw ResumeError("no checkpoint of global step " + std::to_string(step) + " in " + dir +
                    " (its checkpoints' steps: " + (steps.empty() ? "none" : steps) + ")");
}

/// The best checkpoint of `dir` and its local tier by the keep_best metric of the newest
/// checkpoint's config, whose checksums verify: one that does not is skipped with a warning
/// for the next best (the same folder in the other tier first).
LoadedCheckpoint choose_best(const std::string& dir) {
  std::vector<CheckpointInfo> all;
  for (const CheckpointView& tier : tiers_of(dir)) {
    std::vector<CheckpointInfo> listed = tier.list(/*verify=*/false);
    all.insert(all.end(), listed.begin(), listed.end());
  }
  // Oldest first, as the ranking's ties want; a tie of steps keeps the local tier first.
  std::stable_sort(all.begin(), all.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.global_step < b.global_step;
  });
  const BestRanking ranking = rank_checkpoints(all);
  if (!ranking.goal)
    throw ConfigError(
        "gpurun export " + dir +
        " --best: the newest checkpoint's config has no checkpoint.keep_best.metric, "
        "so nothing says which is best; set checkpoint.keep_best: {metric: "
        "eval_loss} in run.yaml (a --resume may add it), or choose one with --step N");
  if (ranking.order.empty())
    throw ConfigError("gpurun export " + dir + " --best: no checkpoint there records " +
                      ranking.goal->metric +
                      " (only epoch checkpoints do, from a gpurun that records metrics); choose "
                      "one with --step N");
  std::string problems;
  for (const size_t i : ranking.order) {
    CheckpointInfo info = CheckpointView::inspect(all[i].path, /*verify=*/true);
    if (info.complete) {
      spdlog::info("the best checkpoint by {} ({}) that verifies: {} ({}={})", ranking.goal->metric,
                   ranking.goal->mode, info.path, ranking.goal->metric, *ranking.values[i]);
      return loaded(std::move(info));
    }
    spdlog::warn("skipping {} ({}={}), which does not verify ({}); taking the next best",
                 printable(info.path), ranking.goal->metric, *ranking.values[i],
                 printable(info.problem));
    problems += "\n  " + printable(info.path) + ": " + printable(info.problem);
  }
  throw ResumeError("no checkpoint of " + dir + " that records " + ranking.goal->metric +
                    " verifies:" + problems);
}

/// The checkpoint to export: `dir` itself when it is one ckpt-* folder; with `step`, the one of
/// that global step; else the newest checkpoint of the root and its local tier, which must
/// verify. A newest one that does not (or one newer set aside as damaged by a resume) is
/// refused, naming it and the newest that verifies: exporting an older state is a choice made
/// with --step or a folder, never one made in silence. Read-only: nothing is renamed.
LoadedCheckpoint choose(const std::string& dir, std::optional<int64_t> step, bool best) {
  if (best && step)
    throw ConfigError("gpurun export " + dir + ": --best and --step exclude each other; give one");
  if (best && CheckpointView::is_checkpoint_folder(dir))
    throw ConfigError("gpurun export " + dir +
                      " --best: --best chooses among a checkpoint root's checkpoints, and " + dir +
                      " is one checkpoint folder; give the root");
  if (best) return choose_best(dir);
  if (CheckpointView::is_checkpoint_folder(dir)) {
    if (step)
      throw ConfigError("gpurun export " + dir +
                        ": --step chooses among a checkpoint root's checkpoints, and " + dir +
                        " is one checkpoint folder; give the root, or the folder alone");
    return CheckpointStore::load(dir);
  }
  if (step) return choose_step(dir, *step);
  // Each tier down to its newest checkpoint that verifies; the newest step of either decides.
  const CheckpointInfo* newest = nullptr;
  const CheckpointInfo* complete = nullptr;
  const CheckpointInfo* lost = nullptr;
  std::vector<CheckpointSummary> summaries;
  const std::vector<CheckpointView> tiers = tiers_of(dir);
  summaries.reserve(tiers.size());
  for (const CheckpointView& tier : tiers) {
    const CheckpointSummary& s = summaries.emplace_back(tier.summary(/*verify=*/true));
    if (s.newest() && (!newest || s.newest()->global_step > newest->global_step))
      newest = s.newest();
    if (s.newest_complete && (!complete || s.newest_complete->global_step > complete->global_step))
      complete = &*s.newest_complete;
    if (!s.set_aside.empty() && (!lost || s.set_aside.back().global_step > lost->global_step))
      lost = &s.set_aside.back();
  }
  if (!newest) {
    throw ResumeError("no checkpoint in " + dir +
                      (lost ? " (only checkpoints set aside as damaged by a resume: `gpurun ckpt "
                              "list " +
                                  dir + "` shows them)"
                            : ""));
  }
  const std::string take =
      complete ? "the newest that verifies is " + complete->path + " (global step " +
                     std::to_string(complete->global_step) + "): export it with --step " +
                     std::to_string(complete->global_step) + ", or name its folder"
               : "no checkpoint there verifies (`gpurun ckpt verify " + dir + "`)";
  if (!complete || complete->global_step < newest->global_step)
    throw ResumeError("the newest checkpoint " + newest->path + " (global step " +
                      std::to_string(newest->global_step) + ") does not verify (" +
                      printable(newest->problem) + "); " + take);
  if (lost && lost->global_step > complete->global_step)
    throw ResumeError("a newer checkpoint, " + lost->path +
                      ", was set aside as damaged by a resume: the steps after global step " +
                      std::to_string(complete->global_step) +
                      " are lost until the run trains them "
                      "again (`gpurun run ... --resume`); " +
                      take);
  if (!starts_with(complete->path, dir))
    spdlog::info("exporting from the local tier: {} (global step {})", complete->path,
                 complete->global_step);
  return loaded(*complete);
}

/// The same xxh3 as model_digest(), over tensors already read from model.pt.
std::string digest_of(const NamedTensors& tensors) {
  Xxh3 h;
  for (const auto& entry : tensors) {
    const at::Tensor t = entry.second.contiguous();
    h.update(t.data_ptr(), t.numel() * t.element_size());
  }
  return h.hex();
}

/// The TorchScript module file a checkpoint was trained from, or "" for other models.
std::string torchscript_source(const CheckpointMeta& meta) {
  const json source = meta.extra.value("model_source", json::object());
  if (source.value("kind", "") == "torchscript") return source.value("path", "");
  const json model = meta.config.value("model", json::object());
  return model.value("torchscript", "");  // written before model_source was recorded
}

/// `chosen` where the loaders can read it: itself on a file system; a bucket's checkpoint
/// fetched first (its files verified as they arrive) into this machine's folder of the root
/// (Checkpointer::default_run_dir()/export).
LoadedCheckpoint on_local_disk(LoadedCheckpoint chosen) {
  if (!is_object_root(chosen.info.path)) return chosen;
  const auto [root, name] = split_folder_path(chosen.info.path);
  CheckpointStore staging(Checkpointer::default_run_dir(root) + "/export", 1);
  spdlog::info("fetching {} into {}", chosen.info.path, staging.dir());
  staging.copy_from(*open_storage(root), name);
  return CheckpointStore::load(staging.storage()->path(name));
}

}  // namespace

int export_command(const std::string& ckpt_dir, const std::string& to, std::ostream& out,
                   bool merge_lora, std::optional<int64_t> step, const std::string& format,
                   const std::string& dtype, int64_t max_shard_bytes, bool best) {
  std::error_code ec;
  if (is_object_root(ckpt_dir))
    open_storage(ckpt_dir)->check_readable();
  else if (!stdfs::is_directory(ckpt_dir, ec))
    throw ConfigError("gpurun export: no such checkpoint directory: " + ckpt_dir);
  if (to.empty()) throw ConfigError("gpurun export: --to must not be empty");
  if (format == "hf" || format == "peft") {
    HfExport options;
    options.format = format;
    options.merge_lora = merge_lora;
    options.max_shard_bytes = max_shard_bytes;
    if (dtype == "float32") options.dtype = at::kFloat;
    if (dtype == "bfloat16") options.dtype = at::kBFloat16;
    if (dtype == "float16") options.dtype = at::kHalf;
    out << export_hf(on_local_disk(choose(ckpt_dir, step, best)), to, options);
    return kExitOk;
  }
  // An existing file is replaced (atomically); a directory never is: the rename would fail
  // after the export's work, or, named with a trailing slash, the path is no file at all.
  if (to.back() == '/' || stdfs::is_directory(to, ec))
    throw ConfigError("gpurun export --to " + to +
                      ": --to is a directory; name the file to write the model to");
  const stdfs::path parent = stdfs::absolute(to, ec).parent_path();
  if (!stdfs::is_directory(parent, ec))
    throw ConfigError("gpurun export --to " + to + ": directory " + parent.string() +
                      " does not exist");

  const LoadedCheckpoint checkpoint = on_local_disk(choose(ckpt_dir, step, best));
  const CheckpointMeta& meta = checkpoint.meta;
  const std::string module = torchscript_source(meta);
  if (!meta.sharded_optimizer.is_null() && !merge_lora && module.empty()) {
    // A sharded checkpoint streams, one tensor at a time: with master weights its parameters
    // are the fp32 master in the shard files (model.pt holds them in 16 bits).
    export_fp32_state_dict(checkpoint, to);
    out << "exported " << checkpoint.info.path << " (global step " << meta.global_step
        << ", model_digest " << meta.model_digest << ", sharded) to " << to
        << " as a state_dict (torch.load; fp32)\n";
    return kExitOk;
  }
  const NamedTensors weights = load_model_tensors(checkpoint);
  if (digest_of(weights) != meta.model_digest)
    throw ResumeError(checkpoint.info.path +
                      "/model.pt does not match the manifest's model_digest " + meta.model_digest);

  std::string written = "state_dict (torch.load)";
  if (merge_lora) {
    const RunConfig config = config_from_json(meta.config);
    if (config.model.lora.rank <= 0 || !module.empty())
      throw ConfigError("gpurun export --merge-lora: " + checkpoint.info.name +
                        " was trained without model.lora: it has no adapters to merge");
    const double scale = config.model.lora.alpha / static_cast<double>(config.model.lora.rank);
    fs::replace_file(to, pickle_tensors(merge_lora_adapters(weights, scale)));
    written = "state_dict with the LoRA adapters merged (torch.load; alpha/rank " +
              std::to_string(scale) + ")";
  } else if (module.empty()) {
    // The verified file as it is, byte for byte.
    fs::replace_file(to, fs::read_file(checkpoint.info.path + "/model.pt"));
  } else {
    if (!stdfs::is_regular_file(module, ec))
      throw ConfigError("gpurun export: " + checkpoint.info.name +
                        " was trained from the TorchScript module " + module +
                        ", which is gone; export needs it for the module's code (the weights "
                        "alone are in " +
                        checkpoint.info.path + "/model.pt)");
    RunConfig current;
    current.model.torchscript = module;
    const std::string changed = compare_model_source(
        meta.extra.value("model_source", json::object()), describe_model_source(current));
    if (!changed.empty()) spdlog::warn("{}", changed);
    save_torchscript_with_weights(module, weights, to);
    written = "TorchScript module (torch.jit.load)";
  }
  out << "exported " << checkpoint.info.path << " (global step " << meta.global_step
      << ", model_digest " << meta.model_digest << ") to " << to << " as a " << written << "\n";
  return kExitOk;
}

}  // namespace gpurun

#include "cli/export_command.h"

#include <filesystem>
#include <optional>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/store.h"
#include "checkpoint/train_state.h"
#include "cli/ckpt_command.h"
#include "gpurun/config.h"
#include "gpurun/errors.h"
#include "model/fine_tune.h"
#include "model/plugin_loader.h"
#include "model/torchscript_model.h"
#include "util/fs.h"
#include "util/hash.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

/// The checkpoint to export: `dir` itself when it is one ckpt-* folder, else the newest one that
/// verifies of the root and of its local tier on this machine (as a resume chooses: the local
/// one holds the newer state when the run stopped before its copy reached DIR). Read-only:
/// damaged ones are reported, not renamed.
LoadedCheckpoint choose(const std::string& dir) {
  if (CheckpointView::is_checkpoint_folder(dir)) return CheckpointStore::load(dir);
  const CheckpointView view(dir);
  const std::vector<CheckpointInfo> infos = view.list(/*verify=*/false);
  std::optional<CheckpointInfo> newest = view.newest_complete();
  if (const std::string tier = local_tier_of(view, infos); !tier.empty()) {
    const std::optional<CheckpointInfo> local = CheckpointView(tier).newest_complete();
    if (local && (!newest || local->global_step > newest->global_step)) {
      spdlog::info("exporting from the local tier: {} (global step {}; {}'s newest: {})",
                   local->path, local->global_step, dir,
                   newest ? "global step " + std::to_string(newest->global_step) : "none");
      newest = local;
    }
  }
  if (!newest) {
    throw ResumeError("no complete checkpoint in " + dir + " (" + std::to_string(infos.size()) +
                      " ckpt-* folders; `gpurun ckpt verify " + dir + "` says what is wrong)");
  }
  // newest_complete() verified it, checksums included: no second pass over its files.
  CheckpointMeta meta = meta_from_manifest(newest->manifest);
  return LoadedCheckpoint{std::move(*newest), std::move(meta), {}};
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

}  // namespace

int export_command(const std::string& ckpt_dir, const std::string& to, std::ostream& out,
                   bool merge_lora) {
  std::error_code ec;
  if (!stdfs::is_directory(ckpt_dir, ec))
    throw ConfigError("gpurun export: no such checkpoint directory: " + ckpt_dir);
  if (to.empty()) throw ConfigError("gpurun export: --to FILE must not be empty");
  // An existing file is replaced (atomically); a directory never is: the rename would fail
  // after the export's work, or, named with a trailing slash, the path is no file at all.
  if (to.back() == '/' || stdfs::is_directory(to, ec))
    throw ConfigError("gpurun export --to " + to +
                      ": --to is a directory; name the file to write the model to");
  const stdfs::path parent = stdfs::absolute(to, ec).parent_path();
  if (!stdfs::is_directory(parent, ec))
    throw ConfigError("gpurun export --to " + to + ": directory " + parent.string() +
                      " does not exist");

  const LoadedCheckpoint checkpoint = choose(ckpt_dir);
  const CheckpointMeta& meta = checkpoint.meta;
  const NamedTensors weights = load_model_tensors(checkpoint);
  if (digest_of(weights) != meta.model_digest)
    throw ResumeError(checkpoint.info.path +
                      "/model.pt does not match the manifest's model_digest " + meta.model_digest);

  const std::string module = torchscript_source(meta);
  std::string format = "state_dict (torch.load)";
  if (merge_lora) {
    const RunConfig config = config_from_json(meta.config);
    if (config.model.lora.rank <= 0 || !module.empty())
      throw ConfigError("gpurun export --merge-lora: " + checkpoint.info.name +
                        " was trained without model.lora: it has no adapters to merge");
    const double scale = config.model.lora.alpha / static_cast<double>(config.model.lora.rank);
    fs::replace_file(to, pickle_tensors(merge_lora_adapters(weights, scale)));
    format = "state_dict with the LoRA adapters merged (torch.load; alpha/rank " +
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
    format = "TorchScript module (torch.jit.load)";
  }
  out << "exported " << checkpoint.info.path << " (global step " << meta.global_step
      << ", model_digest " << meta.model_digest << ") to " << to << " as a " << format << "\n";
  return kExitOk;
}

}  // namespace gpurun

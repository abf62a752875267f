#include "checkpoint/format/hf_export.h"

#include <unistd.h>

#include <ATen/ops/addmm.h>
#include <c10/core/GradMode.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/format/export_state.h"
#include "checkpoint/format/safetensors.h"
#include "gpurun/config.h"
#include "gpurun/errors.h"
#include "model/fine_tune.h"
#include "model/hf_config.h"
#include "util/fs.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

/// The files of a model folder besides its weights that inference needs (the tokenizer, the
/// generation defaults), copied from the input folder when it is still there.
const char* const kCompanionFiles[] = {
    "tokenizer.json",      "tokenizer_config.json",
    "tokenizer.model",     "special_tokens_map.json",
    "added_tokens.json",   "vocab.json",
    "merges.txt",          "generation_config.json",
    "chat_template.jinja", "chat_template.json"};  // transformers 5 keeps the template apart

std::string last_part(const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? dotted : dotted.substr(dot + 1);
}

std::string regex_escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string(".^$*+?()[]{}|\\").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

/// A folder written in a temporary folder beside `to`, renamed into place by commit().
class FolderWriter {
 public:
  explicit FolderWriter(std::string to) : to_(std::move(to)) {
    // "out/" names the folder out: its parent is where the temporary folder goes.
    while (to_.size() > 1 && to_.back() == '/') to_.pop_back();
    std::error_code ec;
    if (stdfs::exists(to_, ec)) {
      if (!stdfs::is_directory(to_, ec))
        throw ConfigError("gpurun export --to " + to_ +
                          ": it is a file; --format hf and peft "
                          "write a folder");
      if (!stdfs::is_empty(to_, ec))
        throw ConfigError("gpurun export --to " + to_ +
                          ": the folder holds files; name a new "
                          "or empty folder (nothing is overwritten)");
    }
    const stdfs::path parent = stdfs::absolute(to_, ec).parent_path();
    if (!stdfs::is_directory(parent, ec))
      throw ConfigError("gpurun export --to " + to_ + ": directory " + parent.string() +
                        " does not exist");
    tmp_ = to_ + ".tmp-export-" + std::to_string(::getpid());
    stdfs::remove_all(tmp_, ec);
    if (!stdfs::create_directory(tmp_, ec)) throw IoError("mkdir", tmp_, ec.value());
  }
  ~FolderWriter() {
    if (!committed_) {
      std::error_code ec;
      stdfs::remove_all(tmp_, ec);
    }
  }
  std::string path(const std::string& file) const { return tmp_ + "/" + file; }
  void commit() {
    std::error_code ec;
    if (stdfs::is_directory(to_, ec)) stdfs::remove(to_, ec);  // empty: checked above
    fs::sync_dir(tmp_);
    fs::rename_durable(tmp_, to_);
    committed_ = true;
  }

 private:
  std::string to_, tmp_;
  bool committed_ = false;
};

}  // namespace

std::string export_hf(const LoadedCheckpoint& checkpoint, const std::string& to,
                      const HfExport& options) {
  const CheckpointMeta& meta = checkpoint.meta;
  const json source = meta.extra.value("init_from", json::object());
  if (source.value("kind", "") != "hf" || !source.contains("config"))
    throw ConfigError("gpurun export --format " + options.format + ": " + checkpoint.info.name +
                      " was not trained from a Hugging Face folder (model.name hf); --format pt "
                      "(the default) exports any run");
  const RunConfig config = config_from_json(meta.config);
  const LoraConfig& lora = config.model.lora;
  const bool peft = options.format == "peft";
  if (peft && lora.rank <= 0)
    throw ConfigError("gpurun export --format peft: " + checkpoint.info.name +
                      " was trained without model.lora: it has no adapters (--format hf "
                      "writes the whole model)");
  if (peft && options.merge_lora)
    throw ConfigError("gpurun export: --merge-lora writes a whole model: use it with --format hf");
  if (!peft && lora.rank > 0 && !options.merge_lora)
    throw ConfigError("gpurun export --format hf: " + checkpoint.info.name +
                      " trained LoRA adapters: --merge-lora writes the model with them merged, "
                      "--format peft the adapters for PEFT");
  const double scale = lora.rank > 0 ? lora.alpha / static_cast<double>(lora.rank) : 0.0;

  CheckpointWeights weights(checkpoint);
  weights.verify();
  const auto& tensors = weights.tensors();
  const c10::ScalarType out_dtype =
      options.dtype ? *options.dtype
                    : (peft ? at::kFloat : hf_dtype(source.value("dtype", "float32")));
  FolderWriter folder(to);

  // What is written: (output name, index of the values, and for a merged weight its adapters).
  struct Item {
    std::string name;
    size_t index;
    int64_t a = -1, b = -1;
  };
  std::vector<Item> items;
  std::set<std::string> adapted;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].name;
    const std::string a_layer = layer_of(name, ".lora_A");
    if (!a_layer.empty()) adapted.insert(a_layer);
    if (peft) {
      if (!a_layer.empty()) items.push_back({"base_model.model." + a_layer + ".lora_A.weight", i});
      const std::string b_layer = layer_of(name, ".lora_B");
      if (!b_layer.empty()) items.push_back({"base_model.model." + b_layer + ".lora_B.weight", i});
      continue;
    }
    if (is_lora_adapter(name)) continue;
    Item item{name, i};
    const std::string layer = layer_of(name, ".weight");
    if (!layer.empty()) {
      item.a = weights.find(layer + ".lora_A");
      item.b = weights.find(layer + ".lora_B");
    }
    items.push_back(item);
  }
  const auto dtype_for = [&](size_t i) {
    return at::isFloatingType(tensors[i].dtype) ? out_dtype : tensors[i].dtype;
  };
  const auto values = [&](const Item& item) {
    at::Tensor t = weights.read(item.index);
    if (item.a >= 0 && item.b >= 0) {
      c10::NoGradGuard no_grad;
      const at::Tensor a = weights.read(static_cast<size_t>(item.a)).to(at::kFloat);
      const at::Tensor b = weights.read(static_cast<size_t>(item.b)).to(at::kFloat);
      t = at::addmm(t.to(at::kFloat), b, a, 1.0, scale);
    }
    return t.to(dtype_for(item.index));
  };

  int64_t total = 0;
  std::string written;
  if (peft) {
    std::vector<SafetensorsSpec> specs;
    for (const Item& item : items)
      specs.push_back({item.name, dtype_for(item.index), tensors[item.index].shape});
    total = write_safetensors(folder.path("adapter_model.safetensors"), specs,
                              [&](size_t k) { return values(items[k]); });
    // target_modules: the adapted layers' last names, when every Linear weight of such a name
    // was adapted; else their full names as one regular expression (PEFT full-matches a string).
    std::map<std::string, std::set<std::string>> all_of;  // last name -> 2-D weights' layers
    for (const auto& t : tensors) {
      const std::string layer = layer_of(t.name, ".weight");
      if (!layer.empty() && t.shape.size() == 2) all_of[last_part(layer)].insert(layer);
    }
    std::set<std::string> suffixes;
    bool whole = true;
    for (const std::string& layer : adapted) suffixes.insert(last_part(layer));
    for (const std::string& s : suffixes)
      for (const std::string& layer : all_of[s]) whole = whole && adapted.count(layer) > 0;
    json targets;
    if (whole) {
      targets = json::array();
      for (const std::string& s : suffixes) targets.push_back(s);
    } else {
      std::string pattern;
      for (const std::string& layer : adapted)
        pattern += (pattern.empty() ? "" : "|") + regex_escaped(layer);
      targets = "^(" + pattern + ")$";
    }
    const json adapter = {{"peft_type", "LORA"},
                          {"task_type", "CAUSAL_LM"},
                          {"base_model_name_or_path", source.value("path", "")},
                          {"r", lora.rank},
                          {"lora_alpha", lora.alpha},
                          {"lora_dropout", lora.dropout},
                          {"target_modules", targets},
                          {"bias", "none"},
                          {"fan_in_fan_out", false},
                          {"inference_mode", true},
                          {"init_lora_weights", true},
                          {"modules_to_save", nullptr},
                          {"use_rslora", false},
                          {"use_dora", false},
                          {"layers_to_transform", nullptr},
                          {"layers_pattern", nullptr},
                          {"rank_pattern", json::object()},
                          {"alpha_pattern", json::object()},
                          {"revision", nullptr}};
    fs::replace_file(folder.path("adapter_config.json"), adapter.dump(2) + "\n");
    written = "a PEFT LoRA adapter (" + std::to_string(items.size()) + " tensors, r " +
              std::to_string(lora.rank) + ", " + hf_dtype_name(out_dtype) + ")";
  } else {
    // Shards in order, each at most max_shard_bytes unless one tensor is larger, as
    // save_pretrained cuts them.
    std::vector<std::vector<size_t>> shards(1);
    int64_t in_shard = 0;
    for (size_t k = 0; k < items.size(); ++k) {
      int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype_for(items[k].index)));
      for (int64_t d : tensors[items[k].index].shape) bytes *= d;
      if (in_shard > 0 && in_shard + bytes > options.max_shard_bytes) {
        shards.emplace_back();
        in_shard = 0;
      }
      shards.back().push_back(k);
      in_shard += bytes;
      total += bytes;
    }
    json weight_map = json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      const std::string file = shards.size() == 1 ? "model.safetensors" : name;
      std::vector<SafetensorsSpec> specs;
      for (size_t k : shards[s]) {
        specs.push_back({items[k].name, dtype_for(items[k].index), tensors[items[k].index].shape});
        weight_map[items[k].name] = file;
      }
      write_safetensors(folder.path(file), specs,
                        [&](size_t j) { return values(items[shards[s][j]]); });
    }
    if (shards.size() > 1)
      fs::replace_file(
          folder.path("model.safetensors.index.json"),
          json({{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}).dump(2) + "\n");
    fs::replace_file(
        folder.path("config.json"),
        hf_config_with_dtype(source["config"], hf_dtype_name(out_dtype)).dump(2) + "\n");
    const std::string input = source.value("path", "");
    for (const char* file : kCompanionFiles)
      if (!input.empty() && fs::exists(input + "/" + file))
        fs::replace_file(folder.path(file), fs::read_file(input + "/" + file));
    written = "a Hugging Face model folder (" + std::to_string(items.size()) + " tensors in " +
              std::to_string(shards.size()) + " safetensors file" +
              (shards.size() == 1 ? "" : "s") + ", " + hf_dtype_name(out_dtype) +
              (options.merge_lora ? ", LoRA merged" : "") + ")";
  }
  folder.commit();
  return "exported " + checkpoint.info.path + " (global step " + std::to_string(meta.global_step) +
         ", model_digest " + meta.model_digest + ") to " + to + " as " + written + "\n";
}

}  // namespace gpurun

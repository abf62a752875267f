#include "config/rules.h"

#include <charconv>
#include <cstdint>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

namespace gpurun::detail {
namespace {

using json = nlohmann::json;

/// Whether `text` is a whole decimal integer (data.label as a column index).
bool is_integer(const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return !text.empty() && ec == std::errc() && ptr == end;
}

/// Rules between the built-in models' and datasets' keys (a plugin's are its own business).
void check_models_and_data(const RunConfig& c, const RuleFailure& fail) {
  const ModelConfig& m = c.model;
  const DataConfig& d = c.data;
  if (m.name == "resnet" && m.blocks.size() != m.channels.size()) {
    fail("model.blocks", "model.channels",
         "model.blocks must have one entry per stage of model.channels, got " +
             std::to_string(m.blocks.size()) + " and " + std::to_string(m.channels.size()));
  }
  if (m.name == "gpt" && m.width % m.heads != 0) {
    fail("model.width", "model.heads",
         "model.width must be divisible by model.heads, got " + std::to_string(m.width) + " and " +
             std::to_string(m.heads));
  }
  const bool token_data = d.name == "text" || d.name == "tokens";
  if (m.name == "gpt" && token_data && m.context != 0 && m.context < d.context) {
    fail("model.context", "data.context",
         "model.context " + std::to_string(m.context) + " is shorter than data.context " +
             std::to_string(d.context) + ", the length of every sample; use at least " +
             std::to_string(d.context) + ", or 0 for data.context");
  }
  const bool builtin_data =
      d.name == "idx" || d.name == "csv" || d.name == "synthetic" || d.name == "image_folder";
  const bool feature_model = m.name == "mlp" || m.name == "cnn" || m.name == "resnet";
  if (token_data && feature_model) {
    fail("model.name", "data.name",
         "model.name " + m.name + " takes float features, but data.name " + d.name +
             " gives token ids; use model.name gpt");
  } else if (m.name == "gpt" && builtin_data) {
    fail("model.name", "data.name",
         "model.name gpt takes token ids, but data.name " + d.name +
             " gives float features; use data.name text "
             "or tokens");
  }
  if (d.name == "image_folder") {
    if (d.channels != 1 && d.channels != 3)
      fail("data.channels", "data.channels",
           "data.channels must be 1 (grayscale) or 3 (RGB), got " + std::to_string(d.channels));
    for (const auto& [key, list] : {std::pair{"data.mean", &d.mean}, {"data.std", &d.std}}) {
      const auto n = static_cast<int64_t>(list->size());
      if (n > 1 && n != d.channels)
        fail(key, key,
             std::string(key) + " must hold one value or one per channel (" +
                 std::to_string(d.channels) + "), got " + std::to_string(n));
    }
  }
  if (d.name == "csv") {
    if (d.delimiter.size() != 1 && d.delimiter != "\\t" && d.delimiter != "tab") {
      fail("data.delimiter", "data.delimiter",
           "data.delimiter must be one character, \\t or tab, got " + json(d.delimiter).dump());
    }
    if (!d.header && !is_integer(d.label)) {
      fail("data.label", "data.header",
           "data.label " + json(d.label).dump() +
               " names a column, but data.header is false; give a 0-based column index");
    }
  }
}

}  // namespace

void check_model_source(RunConfig& c, const std::function<bool(const std::string&)>& is_set,
                        const RuleFailure& fail) {
  ModelConfig& m = c.model;
  if (!m.plugin.empty() && !m.torchscript.empty()) {
    fail("model.plugin", "model.torchscript",
         "model.plugin and model.torchscript exclude each other; set one");
  } else if (!m.torchscript.empty()) {
    if (is_set("model.name") && m.name != "torchscript")
      fail("model.name", "model.torchscript",
           "model.torchscript is set, so model.name must be torchscript (or left out), got " +
               m.name);
    m.name = "torchscript";
  } else if (m.name == "torchscript") {
    fail("model.name", "model.torchscript",
         "model.name: torchscript needs model.torchscript: FILE (a torch.jit.script module)");
  } else if (!m.plugin.empty() && !is_set("model.name")) {
    fail("model.plugin", "model.name",
         "model.plugin is set, so model.name must name one of the plugin's models");
  }
  if (m.name == "hf" && m.path.empty())
    fail("model.name", "model.path",
         "model.name: hf needs model.path: DIR, a Hugging Face model folder (config.json and "
         "its *.safetensors, as save_pretrained writes them)");
  if (m.name != "hf" && !m.path.empty())
    fail("model.path", "model.name",
         "model.path names a Hugging Face model folder, read by model.name: hf only; model.name "
         "is " +
             m.name);
}

std::string resolved_mode(const MetricGoal& goal) {
  if (goal.mode == "min" || goal.mode == "max") return goal.mode;
  return goal.metric == "eval_accuracy" ? "max" : "min";
}

void resolve_metric_goals(RunConfig& c) {
  for (MetricGoal* goal : {static_cast<MetricGoal*>(&c.train.early_stop),
                           static_cast<MetricGoal*>(&c.checkpoint.keep_best)})
    if (!goal->metric.empty() && goal->mode == "auto") goal->mode = resolved_mode(*goal);
}

std::string batch_split_problem(const RunConfig& c, int64_t world_size) {
  const int64_t batch = c.train.batch_size, accumulation = c.train.accumulation_steps;
  if (world_size >= 1 && batch % (accumulation * world_size) == 0) return "";
  std::string fitting;
  for (int64_t w = 1; w <= 64; ++w)
    if (batch % (accumulation * w) == 0)
      fitting += (fitting.empty() ? "" : ", ") + std::to_string(w);
  return "train.batch_size " + std::to_string(batch) +
         " must be divisible by train.accumulation_steps x world size (" +
         std::to_string(accumulation) + " x " + std::to_string(world_size) +
         "); the world sizes that divide it: " + (fitting.empty() ? "none" : fitting) +
         " (or set train.batch_size to a multiple of " + std::to_string(accumulation * world_size) +
         ")";
}

void check_across_keys(const RunConfig& c, const RuleFailure& fail) {
  if (c.optim.nesterov && !(c.optim.momentum > 0)) {
    fail("optim.nesterov", "optim.momentum",
         "optim.nesterov: true requires optim.momentum > 0, but optim.momentum is " +
             json(c.optim.momentum).dump());
  }
  if (c.train.batch_size % c.train.accumulation_steps != 0) {
    fail("train.batch_size", "train.accumulation_steps",
         "train.batch_size must be divisible by train.accumulation_steps, got " +
             std::to_string(c.train.batch_size) + " and " +
             std::to_string(c.train.accumulation_steps));
  }
  check_models_and_data(c, fail);
}

}  // namespace gpurun::detail

// The rules between keys of run.yaml, checked once every key has its value (config.cpp's
// Assembly): what no single key's limit can say, such as a batch size divisible by the
// accumulation steps, or a model that takes what the data set gives. Private to gpurun_core.
#pragma once

#include <functional>
#include <string>

#include "gpurun/config.h"

namespace gpurun::detail {

/// A broken rule: the two keys it is between (the same key twice for a rule of one key), whose
/// settings the message's place names, and the message.
using RuleFailure = std::function<void(const std::string& key, const std::string& other,
                                       const std::string& message)>;

/// model.torchscript implies model.name torchscript; model.plugin needs model.name set.
/// `is_set(key)` tells whether the file or a --set gave `key`. Sets c.model.name for a
/// TorchScript model.
void check_model_source(RunConfig& c, const std::function<bool(const std::string&)>& is_set,
                        const RuleFailure& fail);

/// `goal`'s mode as min or max: min and max as given; anything else (auto) max for
/// eval_accuracy and min for the losses.
std::string resolved_mode(const MetricGoal& goal);

/// train.early_stop and checkpoint.keep_best: a mode of `auto` becomes resolved_mode(), so the
/// resolved config says which (a group whose metric is off keeps `auto`: it does nothing).
void resolve_metric_goals(RunConfig& c);

/// Every other rule between keys: the optimizer's, the batch's, and those between the built-in
/// models' and data sets' keys (a plugin's are its own business).
void check_across_keys(const RunConfig& c, const RuleFailure& fail);

/// "" when train.batch_size splits over `world_size` ranks (divisible by
/// train.accumulation_steps x world_size); else the message, naming the world sizes up to 64
/// that would split it. Checked by the launcher before it starts any rank, and by the plan.
std::string batch_split_problem(const RunConfig& c, int64_t world_size);

}  // namespace gpurun::detail

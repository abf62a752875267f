// The ranking of epoch checkpoints by a metric their manifests record: what
// checkpoint.keep_best protects from retention, what `gpurun ckpt list` marks and what
// `gpurun export --best` takes (Lightning's ModelCheckpoint(monitor, mode, save_top_k)).
//
// An epoch checkpoint's manifest records the epoch event's metrics as
// extra.metrics = {eval_loss, eval_accuracy, train_loss}; step, minute and signal checkpoints
// record none and are never ranked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/format/checkpoint_types.h"
#include "gpurun/config.h"

namespace gpurun {

/// The metric `metric` (eval_loss, eval_accuracy, train_loss) that `manifest` (a manifest.json)
/// records in extra.metrics; nullopt when it records none or no finite number (a step
/// checkpoint; a NaN loss, which JSON holds as null).
std::optional<double> manifest_metric(const nlohmann::json& manifest, const std::string& metric);

/// Whether `value` beats `best` by more than `min_delta` (>= 0) in `mode` (min | max): in min,
/// value < best - min_delta (Lightning's EarlyStopping). A NaN value never improves; any finite
/// value improves on a NaN or absent best (pass nullopt).
bool improves(double value, std::optional<double> best, const std::string& mode,
              double min_delta = 0);

/// The indices of the best min(k, ranked) entries of `values` (nullopt: not ranked), best
/// first by `mode` (min | max). Ties rank the lower index first: with `values` oldest first, the
/// older checkpoint, which reached that value first, stays among the best.
std::vector<size_t> best_indices(const std::vector<std::optional<double>>& values,
                                 const std::string& mode, int64_t k);

/// checkpoint.keep_best as `manifest`'s config records it (its mode resolved: auto is max for
/// eval_accuracy, min for the losses); nullopt when its metric is off or the manifest has none.
std::optional<KeepBestConfig> manifest_keep_best(const nlohmann::json& manifest);

/// The complete checkpoints of `infos` ranked by the keep_best of the newest complete one's
/// config (the run as it is now), for `gpurun ckpt list` and `gpurun export --best`.
struct BestRanking {
  std::optional<KeepBestConfig> goal;         ///< nullopt: keep_best is off
  std::vector<std::optional<double>> values;  ///< per entry of infos: its metric, if ranked
  std::vector<size_t> order;                  ///< every ranked entry, best first
  /// The 1-based rank of infos[i] when it is among the goal's k best, else 0.
  int64_t rank_of(size_t i) const;
};
BestRanking rank_checkpoints(const std::vector<CheckpointInfo>& infos);

}  // namespace gpurun

#include "checkpoint/format/metric_rank.h"

#include <algorithm>
#include <cmath>

#include "config/rules.h"

namespace gpurun {

std::optional<double> manifest_metric(const nlohmann::json& manifest, const std::string& metric) {
  if (!manifest.is_object() || metric.empty()) return std::nullopt;
  const auto extra = manifest.find("extra");
  if (extra == manifest.end() || !extra->is_object()) return std::nullopt;
  const auto metrics = extra->find("metrics");
  if (metrics == extra->end() || !metrics->is_object()) return std::nullopt;
  const auto value = metrics->find(metric);
  if (value == metrics->end() || !value->is_number()) return std::nullopt;
  const double v = value->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

bool improves(double value, std::optional<double> best, const std::string& mode, double min_delta) {
  if (std::isnan(value)) return false;
  if (!best || std::isnan(*best)) return true;
  return mode == "max" ? value > *best + min_delta : value < *best - min_delta;
}

std::vector<size_t> best_indices(const std::vector<std::optional<double>>& values,
                                 const std::string& mode, int64_t k) {
  std::vector<size_t> ranked;
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i]) ranked.push_back(i);
  // Stable: equal values keep index order, the older first.
  std::stable_sort(ranked.begin(), ranked.end(), [&](size_t a, size_t b) {
    return mode == "max" ? *values[a] > *values[b] : *values[a] < *values[b];
  });
  if (k >= 0 && ranked.size() > static_cast<size_t>(k)) ranked.resize(static_cast<size_t>(k));
  return ranked;
}

std::optional<KeepBestConfig> manifest_keep_best(const nlohmann::json& manifest) {
  const nlohmann::json::json_pointer at("/config/checkpoint/keep_best");
  if (!manifest.is_object() || !manifest.contains(at)) return std::nullopt;
  const nlohmann::json& group = manifest.at(at);
  if (!group.is_object()) return std::nullopt;
  KeepBestConfig goal;
  goal.metric = group.value("metric", std::string());
  if (goal.metric.empty()) return std::nullopt;
  goal.mode = group.value("mode", std::string("auto"));
  goal.mode = detail::resolved_mode(goal);
  goal.k = group.value("k", int64_t{1});
  return goal;
}

int64_t BestRanking::rank_of(size_t i) const {
  if (!goal) return 0;
  for (size_t r = 0; r < order.size() && r < static_cast<size_t>(goal->k); ++r)
    if (order[r] == i) return static_cast<int64_t>(r) + 1;
  return 0;
}

BestRanking rank_checkpoints(const std::vector<CheckpointInfo>& infos) {
  BestRanking ranking;
  ranking.values.resize(infos.size());
  for (auto it = infos.rbegin(); it != infos.rend(); ++it) {
    if (!it->complete) continue;
    ranking.goal = manifest_keep_best(it->manifest);
    break;
  }
  if (!ranking.goal) return ranking;
  for (size_t i = 0; i < infos.size(); ++i)
    if (infos[i].complete)
      ranking.values[i] = manifest_metric(infos[i].manifest, ranking.goal->metric);
  ranking.order = best_indices(ranking.values, ranking.goal->mode, -1);
  return ranking;
}

}  // namespace gpurun

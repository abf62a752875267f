// A run's metrics events (metrics.jsonl, docs/architecture.md "Run directory") read into the
// curves, marks and facts that `gpurun report` shows (view/report_data.h draws them into its
// object). This is where the processes of a stopped, killed or restarted run are told apart and
// reconciled: each process starts with a `plan` event (one without `out_of_memory`) at the
// global step it continues from, and what a killed process logged after that step is dropped
// from the step-indexed curves, as TensorBoard drops it at a SessionLog START.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

// In gpurun::view: these are the report's own vocabulary, not the library's.
namespace gpurun::view {

/// A point of a curve, with the global step it was logged at: a resume drops the points a
/// killed process logged after the step the next one continued from.
struct Point {
  double x = 0, y = 0;
  int64_t step = 0;
};

/// The most points a line carries to the page. A run that logs every step for a week has
/// hundreds of thousands: the page would weigh tens of megabytes and Chart.js draw for seconds,
/// on a chart a thousand pixels wide.
constexpr size_t kMaxPoints = 4000;

/// One line of a chart: every point logged, and the ones drawn.
struct Series {
  explicit Series(std::string name = {}) : label(std::move(name)) {}

  std::string label;
  std::string style = "line";  ///< "line" or "points"
  std::vector<Point> points;   ///< in the order logged; NaN y is a gap

  void add(double x, double y, int64_t step) { points.push_back({x, y, step}); }
  /// Drops the points logged after global step `step`.
  void drop_after(int64_t step);
  bool thinned() const { return points.size() > kMaxPoints; }
  /// The points drawn: all of them up to kMaxPoints; beyond, the points are cut into
  /// kMaxPoints / 2 runs of consecutive points and each run keeps its lowest and its highest,
  /// in their order, so that a spike or a dip stays on the chart (a mean would hide it). A gap
  /// (NaN) is always kept: the line must not join across it.
  std::vector<Point> drawn() const;
  /// {"label", "style", "points": [[x, y / scale]]} of the drawn points.
  nlohmann::json to_json(double scale = 1) const;
};

/// A run's events read into curves, marks and the facts the tables and the summary show.
/// x is the global step, except eval_accuracy's (the epoch, from 1) and throughput's,
/// data_wait's and cost's (minutes since the first event); memory series are bytes, checkpoint
/// series and the data wait seconds.
struct Analysis {
  Series train_loss{"train loss"}, epoch_train_loss{"train loss, epoch mean"},
      eval_loss{"eval loss"}, eval_accuracy{"eval accuracy"}, lr{"learning rate"},
      throughput{"samples/s"}, data_wait{"data wait per optimizer step"},
      epoch_peak{"measured peak, each epoch"}, plan_peak{"the plan's measured peak"},
      plan_estimate{"the plan's estimate"}, capacity{"capacity"}, stall{"stall (training waits)"},
      write{"write (background)"}, cost{"spent, all attempts"};
  /// [{"kind": resume|restart|kill|signal|oom|failure, "label", "step", "minutes", "time"}]
  nlohmann::json marks = nlohmann::json::array();
  nlohmann::json last_plan, last_epoch, last_step, last_done;  ///< null when never logged
  double first_time = 0, last_time = 0;                        ///< unix seconds
  int processes = 0, checkpoints = 0;
  int64_t last_global_step = 0;
  std::optional<double> best_accuracy;
  std::optional<int64_t> diverged_at;  ///< the first step event whose loss is not a number

  double minutes(double time) const { return (time - first_time) / 60; }
  void mark(const char* kind, const std::string& label, int64_t step, double time);
};

/// Reads `events` (metrics.jsonl's, in order; at least one). Throws nothing: a field that is
/// missing or not a finite number is left out.
Analysis analyse(const std::vector<nlohmann::json>& events);

/// fields[key] as a finite number; nullopt when missing, not a number, NaN or infinite.
std::optional<double> number(const nlohmann::json& fields, const char* key);

/// A string as it is, null as "", anything else as its JSON text.
std::string text_of(const nlohmann::json& v);

}  // namespace gpurun::view

#include "view/report_data.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "gpurun/errors.h"
#include "queue/queue_state.h"
#include "report/reporter.h"
#include "util/clock.h"
#include "util/units.h"

namespace gpurun {
namespace {

using nlohmann::json;

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

struct Series {
  std::string label;
  std::string style = "line";
  std::vector<Point> points;

  void add(double x, double y, int64_t step) { points.push_back({x, y, step}); }
  void drop_after(int64_t step) {
    points.erase(
        std::remove_if(points.begin(), points.end(), [&](const Point& p) { return p.step > step; }),
        points.end());
  }
  bool thinned() const { return points.size() > kMaxPoints; }
  /// The points drawn: all of them up to kMaxPoints; beyond, the points are cut into
  /// kMaxPoints / 2 runs of consecutive points and each run keeps its lowest and its highest,
  /// in their order, so that a spike or a dip stays on the chart (a mean would hide it). A gap
  /// (NaN) is always kept: the line must not join across it.
  std::vector<Point> drawn() const {
    if (!thinned()) return points;
    std::vector<Point> out;
    const size_t runs = kMaxPoints / 2, n = points.size();
    for (size_t r = 0; r < runs; ++r) {
      const size_t begin = r * n / runs, end = (r + 1) * n / runs;
      size_t lo = end, hi = end;
      const auto flush = [&] {
        if (lo == end) return;
        out.push_back(points[std::min(lo, hi)]);
        if (hi != lo) out.push_back(points[std::max(lo, hi)]);
        lo = hi = end;
      };
      for (size_t i = begin; i < end; ++i) {
        if (std::isnan(points[i].y)) {
          flush();
          out.push_back(points[i]);
          continue;
        }
        if (lo == end || points[i].y < points[lo].y) lo = i;
        if (hi == end || points[i].y > points[hi].y) hi = i;
      }
      flush();
    }
    return out;
  }
  json to_json(double scale = 1) const {
    json pts = json::array();
    for (const Point& p : drawn()) pts.push_back({p.x, p.y / scale});
    return {{"label", label}, {"style", style}, {"points", pts}};
  }
};

/// metrics fields[key] as a finite number.
std::optional<double> number(const json& fields, const char* key) {
  auto it = fields.find(key);
  if (it == fields.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

int64_t step_of(const json& e, int64_t otherwise) {
  const auto v = number(e, "global_step");
  return v ? static_cast<int64_t>(*v) : otherwise;
}

std::string utc_time(double seconds) {
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string absolute_path(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) ? std::string(resolved) : path;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string text_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

/// A run's events read into curves, marks and the facts the tables and the summary show.
struct Analysis {
  Series train_loss{"train loss"}, epoch_train_loss{"train loss, epoch mean"},
      eval_loss{"eval loss"}, eval_accuracy{"eval accuracy"}, lr{"learning rate"},
      throughput{"samples/s"}, epoch_peak{"measured peak, each epoch"},
      plan_peak{"the plan's measured peak"}, plan_estimate{"the plan's estimate"},
      capacity{"capacity"}, stall{"stall (training waits)"}, write{"write (background)"};
  json marks = json::array();
  json last_plan, last_epoch, last_step, last_done;
  double first_time = 0, last_time = 0;
  int processes = 0, checkpoints = 0;
  int64_t last_global_step = 0;
  std::optional<double> best_accuracy;
  std::optional<int64_t> diverged_at;  ///< the first step event whose loss is not a number

  double minutes(double time) const { return (time - first_time) / 60; }
  void mark(const char* kind, const std::string& label, int64_t step, double time) {
    marks.push_back({{"kind", kind},
                     {"label", label},
                     {"step", step},
                     {"minutes", minutes(time)},
                     {"time", time}});
  }
};

Analysis analyse(const std::vector<json>& events) {
  Analysis a;
  a.first_time = number(events.front(), "time").value_or(0);
  a.stall.style = a.write.style = "points";
  a.eval_accuracy.style = "points";
  bool process_ended = false;  // the current process wrote its `done`
  int restarts = 0;
  json resume;               // the current process's resume event
  int64_t process_step = 0;  // the last step the current process logged
  double process_time = 0;   // and the time of its last event
  for (const json& e : events) {
    const std::string name = e.value("event", "");
    const double time = number(e, "time").value_or(a.last_time);
    a.last_time = std::max(a.last_time, time);
    const int64_t step = step_of(e, a.last_global_step);
    if (name == "resume") {
      resume = e;
    } else if (name == "plan" && !e.value("out_of_memory", false)) {
      // A process starts training; its first step is `start` + 1.
      const int64_t start = step_of(e, resume.is_object() ? step_of(resume, 0) : 0);
      const int process_restarts = static_cast<int>(number(e, "restarts").value_or(0));
      if (a.processes > 0) {
        if (!process_ended)
          a.mark("kill",
                 fmt::format("the process ended without an exit (SIGKILL, OOM killer, reclaim) "
                             "after step {}",
                             process_step),
                 process_step, process_time);
        const std::string from =
            resume.is_object() ? fmt::format("resumed at step {} from {}", start,
                                             text_of(resume.value("path", json())))
                               : fmt::format("started again from step {} (no checkpoint)", start);
        if (process_restarts > restarts)
          a.mark("restart", fmt::format("restart {}: {}", process_restarts, from), start, time);
        else
          a.mark("resume", from, start, time);
      } else if (resume.is_object()) {
        a.mark(
            "resume",
            fmt::format("resumed at step {} from {}", start, text_of(resume.value("path", json()))),
            start, time);
      }
      for (Series* s : {&a.train_loss, &a.epoch_train_loss, &a.eval_loss, &a.eval_accuracy, &a.lr,
                        &a.epoch_peak, &a.plan_peak, &a.plan_estimate, &a.capacity})
        s->drop_after(start);
      restarts = std::max(restarts, process_restarts);
      // No line across the time between two processes: a NaN point is a gap on the page.
      if (a.processes > 0 && !a.throughput.points.empty())
        a.throughput.add(a.minutes(time), std::nan(""), start);
      ++a.processes;
      process_ended = false;
      resume = json();
      process_step = start;
      a.last_plan = e;
      const double at = static_cast<double>(start + 1);
      if (auto v = number(e, "measured_peak_bytes")) a.plan_peak.add(at, *v, start + 1);
      if (auto v = number(e, "estimated_peak_bytes")) a.plan_estimate.add(at, *v, start + 1);
      if (auto v = number(e, "capacity_bytes")) a.capacity.add(at, *v, start + 1);
    } else if (name == "plan") {
      const int64_t from_micro = a.last_plan.value("micro_batch", int64_t{0});
      a.mark("oom",
             fmt::format("out of memory at step {}: micro-batch {} -> {}, accumulation {}",
                         step + 1, from_micro, e.value("micro_batch", int64_t{0}),
                         e.value("accumulation_steps", int64_t{0})),
             step, time);
      a.last_plan = e;
      if (auto v = number(e, "measured_peak_bytes")) a.plan_peak.add(step + 1.0, *v, step + 1);
    } else if (name == "step") {
      a.last_step = e;
      if (auto v = number(e, "loss"))
        a.train_loss.add(static_cast<double>(step), *v, step);
      else if (e.contains("loss") && e["loss"].is_null() && !a.diverged_at)
        a.diverged_at = step;  // NaN or infinity, which JSON writes as null
      if (auto v = number(e, "lr")) a.lr.add(static_cast<double>(step), *v, step);
      if (auto v = number(e, "samples_per_second")) a.throughput.add(a.minutes(time), *v, step);
    } else if (name == "epoch") {
      a.last_epoch = e;
      const double x = static_cast<double>(step);
      if (auto v = number(e, "train_loss")) a.epoch_train_loss.add(x, *v, step);
      if (auto v = number(e, "eval_loss")) a.eval_loss.add(x, *v, step);
      if (auto v = number(e, "eval_accuracy")) {
        a.eval_accuracy.add(number(e, "epoch").value_or(0) + 1, *v, step);
        a.best_accuracy = std::max(a.best_accuracy.value_or(*v), *v);
      }
      if (auto v = number(e, "peak_bytes")) a.epoch_peak.add(x, *v, step);
      if (auto v = number(a.last_plan, "capacity_bytes")) a.capacity.add(x, *v, step);
    } else if (name == "checkpoint") {
      ++a.checkpoints;
      if (auto v = number(e, "stall_seconds")) a.stall.add(static_cast<double>(step), *v, step);
      if (auto v = number(e, "write_seconds")) a.write.add(static_cast<double>(step), *v, step);
    } else if (name == "checkpoint_failed") {
      a.mark(
          "failure",
          fmt::format("checkpoint at step {} failed: {}", step, text_of(e.value("error", json()))),
          step, time);
    } else if (name == "signal") {
      const int sig = static_cast<int>(number(e, "signal").value_or(0));
      a.mark(
          "signal",
          fmt::format("{} at step {}{}", signal_name(sig), step,
                      e.value("immediate", false) ? ": stopped at once" : ": saved, then exit 75"),
          step, time);
    } else if (name == "done") {
      process_ended = true;
      a.last_done = e;
      const int code = static_cast<int>(number(e, "exit_code").value_or(0));
      if (code != 0 && code != 75)
        a.mark("failure", fmt::format("exit {}: {}", code, text_of(e.value("error", json()))), step,
               time);
    }
    if (name != "resume") {  // a resume is the next process's first word
      process_step = std::max(process_step, step);
      process_time = time;
    }
    a.last_global_step = step;
  }
  return a;
}

std::string bytes_text(const json& fields, const char* key) {
  const auto v = number(fields, key);
  return v ? format_bytes(static_cast<int64_t>(*v)) : "";
}

json chart(const char* id, const char* title, const char* x_axis, const std::string& x_label,
           const std::string& y_label, json datasets, bool marks = true) {
  return {{"id", id},
          {"title", title},
          {"x_axis", x_axis},
          {"x_label", x_label},
          {"y_label", y_label},
          {"y_scale", "linear"},
          {"datasets", std::move(datasets)},
          {"marks", marks}};
}

double largest_y(std::initializer_list<const Series*> series) {
  double largest = 0;
  for (const Series* s : series)
    for (const Point& p : s->points) largest = std::max(largest, p.y);
  return largest;
}

json run_charts(const Analysis& a) {
  // The memory chart's unit follows the peaks (GiB from 2 GiB on, else MiB); a capacity more
  // than 20 times the peak (a CPU run's host memory) would flatten them, so the axis is then
  // logarithmic.
  const double peak = largest_y({&a.epoch_peak, &a.plan_peak, &a.plan_estimate});
  const bool gib = peak >= 2.0 * (1 << 30);
  const std::string unit = gib ? "GiB" : "MiB";
  const double scale = gib ? 1 << 30 : 1 << 20;
  const bool logarithmic = peak > 0 && largest_y({&a.capacity}) > 20 * peak;
  json charts = json::array();
  charts.push_back(
      chart("loss", "Loss", "step", "global step", "loss",
            {a.train_loss.to_json(), a.epoch_train_loss.to_json(), a.eval_loss.to_json()}));
  charts.push_back(chart("accuracy", "Eval accuracy per epoch", "epoch", "epoch", "accuracy",
                         {a.eval_accuracy.to_json()}, false));
  charts.push_back(chart("lr", "Learning rate", "step", "global step", "lr", {a.lr.to_json()}));
  charts.push_back(chart("throughput", "Throughput", "minutes",
                         "minutes since the run's first event", "samples/s",
                         {a.throughput.to_json()}));
  charts.push_back(chart("memory", "Peak memory against capacity", "step", "global step",
                         unit + (logarithmic ? " (logarithmic)" : ""),
                         {a.epoch_peak.to_json(scale), a.plan_peak.to_json(scale),
                          a.plan_estimate.to_json(scale), a.capacity.to_json(scale)}));
  charts.back()["y_scale"] = logarithmic ? "logarithmic" : "linear";
  charts.push_back(chart("checkpoints", "Checkpoint stall and write", "step", "global step",
                         "seconds", {a.stall.to_json(), a.write.to_json()}));
  return charts;
}

json table(const std::string& title, json columns, json rows) {
  return {{"title", title}, {"columns", std::move(columns)}, {"rows", std::move(rows)}};
}

json plan_tables(const json& plan) {
  json tables = json::array();
  if (!plan.is_object()) return tables;
  const auto num = [&](const char* key) { return text_of(plan.value(key, json())); };
  // Rows built one by one: a braced list of [string, value] pairs would make a JSON object.
  json settings = json::array();
  const auto setting = [&](const char* name, const std::string& value) {
    settings.push_back(json::array({name, value}));
  };
  setting("global batch", num("global_batch"));
  setting("micro-batch x gradient accumulation x world size",
          fmt::format("{} x {} x {}", num("micro_batch"), num("accumulation_steps"),
                      num("world_size")));
  setting("activation checkpointing", plan.value("activation_checkpointing", false) ? "on" : "off");
  setting("precision", num("precision"));
  setting("eval batch", num("eval_batch"));
  const auto step_seconds = number(plan, "step_seconds");
  setting("seconds per micro-batch (measured)",
          step_seconds ? fmt::format("{:.4g}", *step_seconds) : std::string());
  setting("why", num("reason"));
  tables.push_back(table("Plan", {"setting", "value"}, settings));
  json rows = json::array();
  const json parts = plan.value("measured_peaks", json::object());
  const double capacity = number(plan, "capacity_bytes").value_or(0);
  const std::string largest = plan.value("peak_part", "");
  const auto share = [&](double bytes) {
    return capacity > 0 ? fmt::format("{:.1f} %", 100 * bytes / capacity) : std::string();
  };
  const std::pair<const char*, const char*> names[] = {
      {"training", "training steps"},
      {"evaluation", "evaluation"},
      {"checkpoint_capture", "checkpoint capture"},
      {"resume_loading", "resume loading"},
      {"checkpoint_buffers", "checkpoint buffers kept between saves"}};
  for (const auto& [key, label] : names) {
    const auto v = number(parts, key);
    if (!v) continue;
    rows.push_back({std::string(label) + (largest == key ? " (the peak)" : ""),
                    format_bytes(static_cast<int64_t>(*v)), share(*v)});
  }
  rows.push_back({"estimate of a training step", bytes_text(plan, "estimated_peak_bytes"),
                  share(number(plan, "estimated_peak_bytes").value_or(0))});
  // The estimate's parts (memory/peak_probe.h): where a training step's bytes go.
  const json estimate = plan.value("estimate", json::object());
  const std::pair<const char*, const char*> estimate_parts[] = {
      {"parameters", "- parameters"},
      {"gradients", "- gradients"},
      {"optimizer_state", "- optimizer state"},
      {"activations", "- activations kept for the backward pass"},
      {"weight_casts", "- weight casts (mixed precision)"},
      {"optimizer_temporaries", "- the optimizer step's temporaries"}};
  for (const auto& [key, label] : estimate_parts) {
    const auto v = number(estimate, key);
    if (v && *v > 0) rows.push_back({label, format_bytes(static_cast<int64_t>(*v)), share(*v)});
  }
  rows.push_back({"capacity", bytes_text(plan, "capacity_bytes"), capacity > 0 ? "100 %" : ""});
  tables.push_back(table("Peak breakdown (the probes' measured parts; the estimate's)",
                         {"part", "peak", "of capacity"}, rows));
  return tables;
}

/// "model.name" = "mlp", ... in the config's order.
void flatten(const json& j, const std::string& prefix, json& rows) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), rows);
  } else {
    rows.push_back({prefix, text_of(j)});
  }
}

/// Whether the process that wrote status.json is gone: known on its own host only.
bool process_gone(const json& status) {
  if (!status.is_object() || status.value("host", "") != host_name() || !status.contains("pid") ||
      !status["pid"].is_number_integer())
    return false;
  const auto pid = static_cast<pid_t>(status["pid"].get<int64_t>());
  return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
}

/// status.json's state, corrected: a run whose last word is `done` 0 is finished, and one
/// "running" whose process is gone is dead (SIGKILL, OOM killer, power).
std::string run_state(const RunHistory& run, const Analysis& a) {
  const json& s = run.status;
  std::string state = s.is_object() ? s.value("state", "") : "";
  if (a.last_done.is_object() && a.last_done.value("exit_code", -1) == 0) return "finished";
  if (state == "running" && process_gone(s))
    return "dead (its process is gone: run again with --resume)";
  return state;
}

json run_summary(const RunHistory& run, const Analysis& a) {
  json rows = json::array();
  const json& s = run.status;
  const std::string state = run_state(run, a);
  rows.push_back({"state", state.empty() ? "unknown (no status.json)" : state});
  if (s.is_object() && s.contains("host")) rows.push_back({"host", text_of(s["host"])});
  const int64_t total = s.is_object() ? s.value("total_steps", int64_t{0}) : 0;
  rows.push_back({"global step", total > 0 ? fmt::format("{} of {}", a.last_global_step, total)
                                           : std::to_string(a.last_global_step)});
  if (a.last_epoch.is_object())
    rows.push_back(
        {"epochs finished",
         fmt::format("{}{}", a.last_epoch.value("epoch", int64_t{0}) + 1,
                     s.is_object() && s.contains("epochs") ? " of " + text_of(s["epochs"])
                                                           : std::string())});
  if (auto v = number(a.last_step, "loss"))
    rows.push_back({"last train loss", fmt::format("{:.4f}", *v)});
  if (auto v = number(a.last_epoch, "eval_loss"))
    rows.push_back({"last eval loss", fmt::format("{:.4f}", *v)});
  if (a.best_accuracy)
    rows.push_back({"best eval accuracy", fmt::format("{:.4f}", *a.best_accuracy)});
  rows.push_back({"checkpoints written", std::to_string(a.checkpoints)});
  rows.push_back({"processes", fmt::format("{} ({} restarts)", a.processes,
                                           number(a.last_plan, "restarts").value_or(0))});
  rows.push_back({"wall time", fmt::format("{} (first to last event)",
                                           format_duration(a.last_time - a.first_time))});
  return rows;
}

json events_table(const Analysis& a) {
  json rows = json::array();
  for (const json& m : a.marks)
    rows.push_back({utc_time(m["time"].get<double>()), text_of(m["step"]), m["kind"], m["label"]});
  return table("Events", {"time", "step", "kind", "what"}, rows);
}

json notes_of(const RunHistory& run, const Analysis& a) {
  json notes = json::array();
  if (run_state(run, a) == "running")
    notes.push_back(
        fmt::format("the run is still training (status.json updated {} ago): this "
                    "page is a snapshot; run gpurun report again for a newer one",
                    format_duration(unix_seconds() - run.status.value("updated", unix_seconds()))));
  if (a.diverged_at)
    notes.push_back(
        fmt::format("the train loss is not a number from step {} on (the run "
                    "diverged?): those steps have no point on the loss chart",
                    *a.diverged_at));
  if (run.incomplete_tail)
    notes.push_back(
        fmt::format("metrics.jsonl ends in a line without its end (being written, or "
                    "cut by a kill): read up to line {}",
                    run.complete_lines));
  if (!run.unreadable_lines.empty())
    notes.push_back(
        fmt::format("{} line(s) of metrics.jsonl do not parse and were skipped (the "
                    "first: line {})",
                    run.unreadable_lines.size(), run.unreadable_lines.front()));
  for (const Series* s : {&a.train_loss, &a.lr, &a.throughput, &a.stall, &a.write})
    if (s->thinned())
      notes.push_back(fmt::format(
          "{}: {} points logged, {} drawn (each stretch of consecutive points keeps its lowest "
          "and highest); metrics.jsonl and TensorBoard hold them all",
          s->label, s->points.size(), s->drawn().size()));
  if (run.config.is_null())
    notes.push_back("no config.json in the run directory: the resolved config is not shown");
  return notes;
}

}  // namespace

json run_report_data(const RunHistory& run) {
  const Analysis a = analyse(run.events);
  json tables = plan_tables(a.last_plan);
  if (!run.config.is_null()) {
    json rows = json::array();
    flatten(run.config, "", rows);
    tables.push_back(table("Resolved config", {"key", "value"}, rows));
    tables.back()["collapsed"] = true;  // a hundred keys: shown on a click
  }
  if (!a.marks.empty()) tables.insert(tables.begin(), events_table(a));
  return {{"kind", "run"},
          {"title", absolute_path(run.dir)},
          {"generated", unix_seconds()},
          {"notes", notes_of(run, a)},
          {"summary", run_summary(run, a)},
          {"charts", run_charts(a)},
          {"marks", a.marks},
          {"tables", tables}};
}

json queue_report_data(const std::string& dir) {
  std::optional<QueueState> state;
  try {
    state = read_queue_state(dir);
  } catch (const IoError&) {
    throw;  // the file is there and cannot be read: not the input's fault
  } catch (const Error& e) {
    // Bad input, as a half-written metrics.jsonl is: named, exit 2.
    throw ConfigError("cannot report " + dir + ": " + e.what());
  }
  if (!state) throw ConfigError("no queue.json in " + dir + ": not a queue directory");
  json loss = json::array(), accuracy = json::array(), rows = json::array(), notes = json::array();
  const bool queue_gone = process_gone({{"host", state->host}, {"pid", state->pid}});
  for (const RunRecord& r : state->runs) {
    std::optional<Analysis> a;
    try {
      const RunHistory run = read_run_history(run_dir_of(dir, r.name));
      a = analyse(run.events);
      if (run.incomplete_tail)
        notes.push_back(r.name + ": metrics.jsonl's last line is being written; left out");
    } catch (const Error&) {
      // Not started yet, or nothing logged: a row without a line.
    }
    if (a) {
      Series l = a->train_loss, acc = a->eval_accuracy;
      l.label = acc.label = r.name;
      acc.style = "line";
      loss.push_back(l.to_json());
      accuracy.push_back(acc.to_json());
    }
    // A run recorded running under a queue that is gone was interrupted (queue_summary.h);
    // an exit belongs to a run whose last attempt ended.
    const bool interrupted = r.state == RunState::kRunning && queue_gone;
    const bool ended = r.state != RunState::kRunning && r.state != RunState::kPending;
    const std::string exit = !(ended || interrupted) || r.attempts == 0 ? std::string()
                             : r.signal != 0                            ? signal_name(r.signal)
                                             : std::to_string(r.exit_code);
    rows.push_back(
        {r.name, r.seed ? std::to_string(*r.seed) : "",
         interrupted ? "interrupted" : run_state_name(r.state), std::to_string(r.attempts),
         std::to_string(r.restarts), exit,
         r.wall_seconds > 0 ? format_duration(r.wall_seconds) : "",
         a ? std::to_string(a->last_global_step) : "",
         a && number(a->last_step, "loss") ? fmt::format("{:.4f}", *number(a->last_step, "loss"))
                                           : "",
         a && a->best_accuracy ? fmt::format("{:.4f}", *a->best_accuracy) : "", r.error});
  }
  json charts = json::array();
  charts.push_back(
      chart("loss", "Train loss, one line per run", "step", "global step", "loss", loss, false));
  charts.push_back(chart("accuracy", "Eval accuracy per epoch, one line per run", "epoch", "epoch",
                         "accuracy", accuracy, false));
  json summary = json::array({json::array({"queue file", state->queue_file}),
                              json::array({"host", state->host}),
                              json::array({"runs", std::to_string(state->runs.size())}),
                              json::array({"parallel", std::to_string(state->parallel)}),
                              json::array({"updated", utc_time(state->updated)})});
  return {{"kind", "queue"},
          {"title", absolute_path(dir)},
          {"generated", unix_seconds()},
          {"notes", notes},
          {"summary", summary},
          {"charts", charts},
          {"marks", json::array()},
          {"tables",
           json::array({table("Runs",
                              {"run", "seed", "state", "attempts", "restarts", "exit", "wall",
                               "global step", "last train loss", "best eval accuracy", "error"},
                              rows)})}};
}

}  // namespace gpurun

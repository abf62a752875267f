#include "view/report_data.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include <algorithm>
#include <ctime>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "gpurun/errors.h"
#include "queue/queue_state.h"
#include "util/clock.h"
#include "util/signals.h"
#include "util/text.h"
#include "util/units.h"
#include "view/run_analysis.h"

namespace gpurun {

using view::analyse;
using view::Analysis;
using view::number;
using view::Point;
using view::Series;
using view::text_of;

namespace {

using nlohmann::json;

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
  // Beside the throughput, on its axis: the seconds of each step the training thread waited
  // for its batches (data/loader.h); near 0 when the loader keeps up.
  charts.push_back(chart("data_wait", "Data wait", "minutes", "minutes since the run's first event",
                         "seconds per optimizer step", {a.data_wait.to_json()}));
  if (!a.cost.points.empty())
    charts.push_back(chart("cost", "Cost over time", "minutes",
                           "minutes since the run's first event",
                           "spent (cost.price_per_hour x ranks x hours)", {a.cost.to_json()}));
  charts.push_back(chart("memory", "Peak memory against capacity", "step", "global step",
                         unit + (logarithmic ? " (logarithmic)" : ""),
                         {a.epoch_peak.to_json(scale), a.plan_peak.to_json(scale),
                          a.plan_estimate.to_json(scale), a.capacity.to_json(scale)}));
  charts.back()["y_scale"] = logarithmic ? "logarithmic" : "linear";
  charts.push_back(chart("checkpoints", "Checkpoint stall and write", "step", "global step",
                         "seconds", {a.stall.to_json(), a.write.to_json()}));
  return charts;
}

/// One colour per label on the page (view/report.js draws the palette's colour of that index),
/// counted over every dataset of every chart in order, empty ones included: a series keeps its
/// colour whether or not another has points yet (a live snapshot before the first evaluation,
/// a queue run that has not logged), and a queue's run has one colour in every chart.
void assign_colours(json& charts) {
  std::map<std::string, int> index;
  for (json& c : charts)
    for (json& d : c["datasets"])
      d["colour"] =
          index.emplace(d.value("label", ""), static_cast<int>(index.size())).first->second;
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
      {"checkpoint_buffers", "checkpoint buffers kept between saves"},
      {"checkpoint_copy", "the copy of the state a save takes"}};
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

/// The run's checkpoints, checked by manifests and sizes (queue/queue_state.h): the text of
/// its row, and the problem ("" when none).
std::pair<std::string, std::string> checkpoints_of(const std::string& run_dir) {
  try {
    const RunCheckpoints checked = check_run_checkpoints(run_dir, /*verify=*/false);
    return {checked.summary.describe(), checked.problem};
  } catch (const Error& e) {
    return {std::string("cannot be read: ") + e.what(), e.what()};
  }
}

json run_summary(const RunHistory& run, const Analysis& a) {
  json rows = json::array();
  const json& s = run.status;
  const std::string state = run_state(run, a);
  const auto [checkpoints, problem] = checkpoints_of(run.dir);
  rows.push_back({"state", state.empty()                             ? "unknown (no status.json)"
                           : state == "finished" && !problem.empty() ? "finished, but its final "
                                                                       "checkpoint is not intact"
                                                                     : state});
  rows.push_back({"checkpoints", checkpoints});
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
  if (auto v = number(a.last_step, "cost"))
    rows.push_back({"cost", fmt::format("{:.2f} spent by the last step event, all attempts", *v)});
  return rows;
}

/// A queue run's checkpoint cell: "ok", "-" when it saved nothing, else "DAMAGED: problem".
std::string checkpoint_cell(const std::string& run_dir) {
  try {
    const RunCheckpoints checked = check_run_checkpoints(run_dir, /*verify=*/false);
    const std::string& problem = checked.problem;
    if (!problem.empty()) return starts_with(problem, "DAMAGED") ? problem : "DAMAGED: " + problem;
    return checked.summary.newest_complete ? "ok" : "-";
  } catch (const Error& e) {
    return std::string("cannot be read: ") + e.what();
  }
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
  for (const Series* s :
       {&a.train_loss, &a.lr, &a.throughput, &a.data_wait, &a.stall, &a.write, &a.cost})
    if (s->thinned())
      notes.push_back(fmt::format(
          "{}: {} points logged, {} drawn (each stretch of consecutive points keeps its lowest "
          "and highest); metrics.jsonl and TensorBoard hold them all",
          s->label, s->points.size(), s->drawn().size()));
  if (run.config.is_null())
    notes.push_back("no config.json in the run directory: the resolved config is not shown");
  if (const std::string problem = checkpoints_of(run.dir).second; !problem.empty())
    notes.push_back("the run's checkpoints are not intact: " + problem);
  notes.push_back(
      "checkpoints: manifests and file sizes checked, checksums not read (`gpurun ckpt verify` "
      "reads them)");
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
  json charts = run_charts(a);
  assign_colours(charts);
  return {{"kind", "run"},
          {"title", absolute_path(run.dir)},
          {"generated", unix_seconds()},
          {"notes", notes_of(run, a)},
          {"summary", run_summary(run, a)},
          {"charts", charts},
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
    // Every run has its series, empty before it logs: its colour is its place in the queue.
    Series l = a ? a->train_loss : Series(), acc = a ? a->eval_accuracy : Series();
    l.label = acc.label = r.name;
    acc.style = "line";
    loss.push_back(l.to_json());
    accuracy.push_back(acc.to_json());
    // A run recorded running under a queue that is gone was interrupted (queue_summary.h);
    // an exit belongs to a run whose last attempt ended.
    const bool interrupted = r.state == RunState::kRunning && queue_gone;
    const bool ended = r.state != RunState::kRunning && r.state != RunState::kPending;
    const std::string exit = !(ended || interrupted) || r.attempts == 0 ? std::string()
                             : r.signal != 0                            ? signal_name(r.signal)
                                             : std::to_string(r.exit_code);
    rows.push_back({r.name, r.seed ? std::to_string(*r.seed) : "",
                    interrupted ? "interrupted" : run_state_name(r.state),
                    std::to_string(r.attempts), std::to_string(r.restarts), exit,
                    r.attempts > 0 ? format_duration(run_wall_seconds(dir, r, !queue_gone)) : "",
                    a ? std::to_string(a->last_global_step) : "",
                    a && number(a->last_step, "loss")
                        ? fmt::format("{:.4f}", *number(a->last_step, "loss"))
                        : "",
                    a && a->best_accuracy ? fmt::format("{:.4f}", *a->best_accuracy) : "",
                    r.attempts > 0 ? checkpoint_cell(run_dir_of(dir, r.name)) : "", r.error});
  }
  notes.push_back(
      "checkpoint: manifests and file sizes checked, checksums not read (`gpurun ckpt verify "
      "DIR/runs/NAME` reads them)");
  json charts = json::array();
  charts.push_back(
      chart("loss", "Train loss, one line per run", "step", "global step", "loss", loss, false));
  charts.push_back(chart("accuracy", "Eval accuracy per epoch, one line per run", "epoch", "epoch",
                         "accuracy", accuracy, false));
  assign_colours(charts);
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
          {"tables", json::array({table("Runs",
                                        {"run", "seed", "state", "attempts", "restarts", "exit",
                                         "wall", "global step", "last train loss",
                                         "best eval accuracy", "checkpoint", "error"},
                                        rows)})}};
}

}  // namespace gpurun

#include "queue/queue_summary.h"
#include "util/units.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <limits>

#include "gpurun/errors.h"
#include "util/clock.h"
#include "util/fs.h"
#include "util/text.h"

namespace gpurun {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double number(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : kNaN;
}

std::string fixed(double v, const char* format) {
  if (std::isnan(v)) return "";
  char buf[48];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string seed_text(const RunRecord& r) { return r.seed ? std::to_string(*r.seed) : ""; }

std::string exit_text(const RunRecord& r) {
  if (r.signal != 0) return "sig " + std::to_string(r.signal);
  return r.exit_code < 0 ? "" : std::to_string(r.exit_code);
}

nlohmann::json or_null(double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); }

/// Whether the queue that wrote `s` still runs: judged on its own host only (by its pid).
std::string queue_liveness(const QueueState& s) {
  if (s.host != host_name()) return "unknown (the queue ran on " + s.host + ")";
  if (s.pid > 0 && (::kill(static_cast<pid_t>(s.pid), 0) == 0 || errno == EPERM))
    return "live (pid " + std::to_string(s.pid) + ")";
  return "not running";
}

}  // namespace

std::vector<SummaryRow> summary_rows(const std::string& dir, const QueueState& state) {
  std::vector<SummaryRow> rows;
  for (const RunRecord& r : state.runs) {
    SummaryRow row{r, 0, kNaN, kNaN, kNaN, ""};
    try {
      const RunCheckpoints checked = check_run_checkpoints(run_dir_of(dir, r.name), false);
      row.checkpoint = !checked.problem.empty()          ? checked.problem
                       : checked.summary.newest_complete ? "ok"
                                                         : "";
    } catch (const IoError& e) {
      row.checkpoint = std::string("cannot be read: ") + e.what();
    }
    const RunMetrics m = read_run_metrics(run_dir_of(dir, r.name));
    if (m.last_epoch) {
      const nlohmann::json& e = *m.last_epoch;
      if (e.contains("epoch") && e["epoch"].is_number_integer())
        row.epochs = e["epoch"].get<int64_t>() + 1;  // metrics.jsonl counts epochs from 0
      row.train_loss = number(e, "train_loss");
      row.eval_loss = number(e, "eval_loss");
      row.eval_accuracy = number(e, "eval_accuracy");
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

void print_summary_table(const std::vector<SummaryRow>& rows, std::ostream& out) {
  std::vector<std::vector<std::string>> cells = {{"run", "seed", "state", "exit", "restarts",
                                                  "wall", "epochs", "eval_loss", "eval_acc",
                                                  "checkpoint"}};
  std::string damaged;
  for (const SummaryRow& row : rows) {
    const RunRecord& r = row.run;
    const bool ok = row.checkpoint.empty() || row.checkpoint == "ok";
    cells.push_back({r.name, seed_text(r), run_state_name(r.state), exit_text(r),
                     std::to_string(r.restarts),
                     r.attempts > 0 ? format_duration(r.wall_seconds) : "",
                     std::to_string(row.epochs), fixed(row.eval_loss, "%.4f"),
                     fixed(row.eval_accuracy, "%.4f"), ok ? row.checkpoint : "DAMAGED"});
    if (!ok) damaged += r.name + ": " + row.checkpoint + "\n";
  }
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& line : cells)
    for (size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
  for (const auto& line : cells) {
    std::string text;
    for (size_t i = 0; i < line.size(); ++i) {
      std::string cell = line[i].empty() ? "-" : line[i];
      // Names and states read left-aligned, numbers right-aligned.
      const std::string pad(width[i] - std::min(width[i], cell.size()), ' ');
      text += (i == 0 ? "" : "  ") + (i < 3 || i + 1 == line.size() ? cell + pad : pad + cell);
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out << text << "\n";
  }
  out << damaged
      << "(checkpoint: manifests and file sizes checked, checksums not read; `gpurun ckpt "
         "verify` reads them)\n";
}

nlohmann::json summary_json(const std::vector<SummaryRow>& rows) {
  nlohmann::json runs = nlohmann::json::array();
  int finished = 0, failed = 0;
  for (const SummaryRow& row : rows) {
    const RunRecord& r = row.run;
    finished += r.state == RunState::kFinished;
    failed += r.state == RunState::kFailed;
    runs.push_back(
        {{"run", r.name},
         {"seed", r.seed ? nlohmann::json(*r.seed) : nlohmann::json()},
         {"state", run_state_name(r.state)},
         {"exit_code", r.exit_code < 0 ? nlohmann::json() : nlohmann::json(r.exit_code)},
         {"signal", r.signal},
         {"restarts", r.restarts},
         {"wall_seconds", r.wall_seconds},
         {"epochs", row.epochs},
         {"train_loss", or_null(row.train_loss)},
         {"eval_loss", or_null(row.eval_loss)},
         {"eval_accuracy", or_null(row.eval_accuracy)},
         {"checkpoint", row.checkpoint.empty() ? nlohmann::json() : nlohmann::json(row.checkpoint)},
         {"error", r.error}});
  }
  const int total = static_cast<int>(rows.size());
  return {{"runs", runs},
          {"finished", finished},
          {"failed", failed},
          {"other", total - finished - failed},
          {"checkpoints_checked", "sizes"}};
}

void write_summary(const std::string& dir, const std::vector<SummaryRow>& rows) {
  std::string csv =
      "run,seed,state,exit_code,restarts,wall_seconds,epochs,train_loss,eval_loss,"
      "eval_accuracy\n";
  for (const SummaryRow& row : rows) {
    const RunRecord& r = row.run;
    // Names are [A-Za-z0-9._-] (queue_file.h): no field needs quoting.
    csv += r.name + "," + seed_text(r) + "," + run_state_name(r.state) + "," +
           (r.exit_code < 0 ? "" : std::to_string(r.exit_code)) + "," + std::to_string(r.restarts) +
           "," + fixed(r.wall_seconds, "%.3f") + "," + std::to_string(row.epochs) + "," +
           fixed(row.train_loss, "%.6g") + "," + fixed(row.eval_loss, "%.6g") + "," +
           fixed(row.eval_accuracy, "%.6g") + "\n";
  }
  fs::with_retries([&] { fs::replace_file(dir + "/summary.csv", csv); });
  const std::string json = summary_json(rows).dump(2) + "\n";
  fs::with_retries([&] { fs::replace_file(dir + "/summary.json", json); });
}

int queue_status(const std::string& dir, bool json, std::ostream& out) {
  std::optional<QueueState> state = read_queue_state(dir);
  if (!state) throw Error("no queue in " + dir + " (no queue.json)");
  std::vector<SummaryRow> rows = summary_rows(dir, *state);
  const std::string live = queue_liveness(*state);
  // A running attempt's time counts from its start (queue.json adds it up at its end).
  for (SummaryRow& row : rows)
    row.run.wall_seconds = run_wall_seconds(dir, row.run, starts_with(live, "live"));
  // A running run's progress, from its own status.json (report/reporter.h).
  auto run_status = [&](const RunRecord& r) {
    try {
      const nlohmann::json s = nlohmann::json::parse(
          fs::read_file(run_dir_of(dir, r.name) + "/status.json"), nullptr, false);
      return s.is_object() ? s : nlohmann::json();
    } catch (const std::exception&) {
      return nlohmann::json();
    }
  };
  if (json) {
    nlohmann::json j = to_json(*state);
    j["dir"] = dir;
    j["live"] = starts_with(live, "live");
    const nlohmann::json summary = summary_json(rows);
    for (size_t i = 0; i < state->runs.size(); ++i) {
      j["runs"][i]["summary"] = summary["runs"][i];
      j["runs"][i]["status"] = run_status(state->runs[i]);
    }
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  out << "queue dir   " << dir << "\n"
      << "queue file  " << state->queue_file << "\n"
      << "queue       " << live << ", updated " << format_duration(unix_seconds() - state->updated)
      << " ago, " << state->parallel << " at a time\n\n";
  // A run recorded running under a queue that is gone was interrupted: the same command
  // resumes it (queue_runner.h).
  std::vector<SummaryRow> shown = rows;
  if (live == "not running") {
    for (SummaryRow& row : shown)
      if (row.run.state == RunState::kRunning) row.run.state = RunState::kInterrupted;
  }
  print_summary_table(shown, out);
  if (live == "not running" && std::any_of(shown.begin(), shown.end(), [](const SummaryRow& r) {
        return r.run.state == RunState::kInterrupted || r.run.state == RunState::kPending;
      }))
    out << "runs are left: the queue's own command continues them\n";
  for (const RunRecord& r : state->runs) {
    if (r.state != RunState::kRunning || live == "not running") continue;
    const nlohmann::json s = run_status(r);
    if (s.is_null()) continue;
    auto text = [&](const char* key) { return s.contains(key) ? s[key].dump() : "?"; };
    int64_t epoch =
        s.contains("epoch") && s["epoch"].is_number_integer() ? s["epoch"].get<int64_t>() + 1 : 0;
    out << r.name << ": epoch " << epoch << " of " << text("epochs") << ", step "
        << text("global_step") << " of " << text("total_steps") << " (pid " << text("pid") << ", "
        << s.value("state", "?") << ")\n";
  }
  return 0;
}

}  // namespace gpurun

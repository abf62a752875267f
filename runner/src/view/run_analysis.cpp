#include "view/run_analysis.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "util/signals.h"

namespace gpurun::view {

using nlohmann::json;

namespace {

int64_t step_of(const json& e, int64_t otherwise) {
  const auto v = number(e, "global_step");
  return v ? static_cast<int64_t>(*v) : otherwise;
}

}  // namespace

void Series::drop_after(int64_t step) {
  points.erase(
      std::remove_if(points.begin(), points.end(), [&](const Point& p) { return p.step > step; }),
      points.end());
}

std::vector<Point> Series::drawn() const {
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

json Series::to_json(double scale) const {
  json pts = json::array();
  for (const Point& p : drawn()) pts.push_back({p.x, p.y / scale});
  return {{"label", label}, {"style", style}, {"points", pts}};
}

void Analysis::mark(const char* kind, const std::string& label, int64_t step, double time) {
  marks.push_back({{"kind", kind},
                   {"label", label},
                   {"step", step},
                   {"minutes", minutes(time)},
                   {"time", time}});
}

std::optional<double> number(const json& fields, const char* key) {
  auto it = fields.find(key);
  if (it == fields.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

std::string text_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

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
      for (Series* s : {&a.throughput, &a.data_wait, &a.cost})
        if (a.processes > 0 && !s->points.empty()) s->add(a.minutes(time), std::nan(""), start);
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
      if (auto v = number(e, "data_wait_seconds")) a.data_wait.add(a.minutes(time), *v, step);
      // The ledger of every attempt (train/cost_ledger.h): flat across the gaps between them.
      if (auto v = number(e, "cost")) a.cost.add(a.minutes(time), *v, step);
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
      // A cloud's preemption notice names itself rather than the SIGTERM it stands for.
      const json notice = e.value("notice", json());
      const std::string cause =
          notice.is_object() ? fmt::format("{} {} notice", text_of(notice.value("cloud", json())),
                                           text_of(notice.value("kind", json())))
                             : signal_name(sig);
      a.mark(
          "signal",
          fmt::format("{} at step {}{}", cause, step,
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

}  // namespace gpurun::view

#include "notify/notice_message.h"

#include <fmt/format.h>

#include "util/clock.h"

namespace gpurun {
namespace {

using json = nlohmann::json;

std::string hours(double seconds) {
  if (seconds < 120) return fmt::format("{:.0f} s", seconds);
  if (seconds < 3600 * 2) return fmt::format("{:.0f} min", seconds / 60);
  return fmt::format("{:.1f} h", seconds / 3600);
}

// "1.2 h, 3.60 spent of 25.00" from the cost summary (train/cost_ledger.h).
std::string money(const json& m) {
  if (!m.contains("elapsed_seconds")) return "";
  std::string out = hours(m["elapsed_seconds"].get<double>());
  const json cost = m.value("cost", json::object());
  if (cost.contains("spent") && cost["spent"].is_number()) {
    out += fmt::format(", {:.2f} spent", cost["spent"].get<double>());
    if (cost.contains("budget") && cost["budget"].is_number())
      out += fmt::format(" of {:.2f}", cost["budget"].get<double>());
  }
  return out;
}

std::string where(const json& m) {
  if (!m.contains("step")) return "";
  std::string out = fmt::format("step {}", m["step"].get<int64_t>());
  if (m.contains("total_steps")) out += fmt::format(" of {}", m["total_steps"].get<int64_t>());
  if (m.contains("epoch") && m.contains("epochs"))
    out += fmt::format(" (epoch {}/{})", m["epoch"].get<int64_t>(), m["epochs"].get<int64_t>());
  return out;
}

std::string metrics(const json& m) {
  std::string out;
  if (m.contains("eval_loss")) out += fmt::format("eval loss {:.4f}", m["eval_loss"].get<double>());
  if (m.contains("eval_accuracy"))
    out += fmt::format("{}accuracy {:.4f}", out.empty() ? "eval " : ", ",
                       m["eval_accuracy"].get<double>());
  if (out.empty() && m.contains("loss")) out = fmt::format("loss {:.4f}", m["loss"].get<double>());
  return out;
}

void copy_if(const json& from, const char* name, json& to, const char* as = nullptr) {
  if (from.contains(name) && !from[name].is_null()) to[as ? as : name] = from[name];
}

}  // namespace

std::string describe_cost(const json& cost) {
  if (!cost.is_object() || !cost.contains("seconds")) return "-";
  const int64_t attempts = cost.value("attempts", int64_t{1});
  const std::string span = fmt::format("{} over {} attempt{}", hours(cost.value("seconds", 0.0)),
                                       attempts, attempts == 1 ? "" : "s");
  if (!cost.contains("spent") || !cost["spent"].is_number())
    return span + "; no price known (cost.price_per_hour)";
  std::string out = fmt::format("{:.2f} spent", cost["spent"].get<double>());
  if (cost.contains("budget") && cost["budget"].is_number())
    out += fmt::format(" of a budget of {:.2f}", cost["budget"].get<double>());
  out += ", " + span;
  if (cost.contains("price_per_hour") && cost["price_per_hour"].is_number())
    out += fmt::format(", at {:.2f} an hour", cost["price_per_hour"].get<double>());
  if (cost.contains("price_source") && cost["price_source"].is_string())
    out += " (" + cost["price_source"].get<std::string>() + ")";
  return out;
}

std::string first_line(const std::string& error) {
  std::string line = error.substr(0, error.find('\n'));
  if (line.size() > 300) line = line.substr(0, 297) + "...";
  return line;
}

json notice_message(const std::string& event, const std::string& run_name, const std::string& host,
                    const json& status, const json& details) {
  json m = {{"event", event}, {"run", run_name}, {"host", host}, {"time", unix_seconds()}};
  copy_if(status, "global_step", m, "step");
  copy_if(status, "total_steps", m);
  // status.json's epoch is 0-based; a person counts from 1.
  if (status.contains("epoch") && status["epoch"].is_number_integer())
    m["epoch"] = status["epoch"].get<int64_t>() + 1;
  copy_if(status, "epochs", m);
  for (const char* name : {"loss", "eval_loss", "eval_accuracy", "restarts", "job"})
    copy_if(status, name, m);
  copy_if(status, "last_checkpoint", m, "checkpoint");
  if (status.contains("cost") && status["cost"].is_object()) {
    m["cost"] = status["cost"];
    copy_if(status["cost"], "seconds", m, "elapsed_seconds");
  }
  if (status.contains("error") && status["error"].is_string())
    m["error"] = first_line(status["error"].get<std::string>());
  for (const auto& [key, value] : details.items()) m[key] = value;
  if (m.contains("error") && m["error"].is_string())
    m["error"] = first_line(m["error"].get<std::string>());
  m["text"] = notice_text(m);
  m["content"] = m["text"];  // Discord's incoming webhooks read `content`, Slack's `text`
  return m;
}

std::string notice_text(const json& m) {
  const std::string event = m.value("event", std::string());
  std::string what;
  const std::string at = where(m);
  if (event == "started") {
    what =
        m.value("resumed", false) ? "resumed at " + at : "started" + (at.empty() ? "" : ", " + at);
  } else if (event == "finished") {
    what = "finished";
    if (m.value("reason", std::string()) == "early_stop") {
      const json stop = m.value("early_stop", json::object());
      what +=
          stop.is_object() && stop.contains("metric") && stop.contains("epochs_without_improvement")
              ? fmt::format(" early: {} did not improve for {} epochs",
                            stop["metric"].get<std::string>(),
                            stop["epochs_without_improvement"].dump())
              : std::string(" early");
    }
    what += at.empty() ? "" : " at " + at;
    if (const std::string s = metrics(m); !s.empty()) what += "; " + s;
  } else if (event == "preempted") {
    what = "preempted";
    if (m.contains("cause")) what += " by " + m["cause"].get<std::string>();
    if (!at.empty()) what += " at " + at;
    what += "; it saves and exits 75: run again with --resume";
  } else if (event == "failed") {
    what = "failed" + (at.empty() ? "" : " at " + at);
    if (m.contains("error")) what += ": " + m["error"].get<std::string>();
  } else if (event == "stalled") {
    what = fmt::format("stalled: no progress for {:.0f} s", m.value("stalled_seconds", 0.0));
    if (!at.empty()) what += " at " + at;
    what += "; its workers were killed";
  } else if (event == "checkpoint_failed") {
    what = "a checkpoint failed" + (at.empty() ? "" : " at " + at);
    if (m.contains("error")) what += ": " + m["error"].get<std::string>();
    const int64_t failures = m.value("failures_in_a_row", int64_t{1});
    const int64_t allowed = m.value("max_failures", int64_t{0});
    if (m.value("final", false))
      what += "; it was the final checkpoint, and the run fails";
    else if (m.value("stops", false))
      what +=
          fmt::format("; {} failures in a row is checkpoint.max_failures: the run stops", failures);
    else if (allowed > 0)
      what += fmt::format("; training goes on ({} of {} failures in a row)", failures, allowed);
    else
      what += "; training goes on";
  } else if (event == "budget") {
    what = "stopped at its budget" + (at.empty() ? "" : " at " + at) +
           "; saved; raise cost.budget to resume";
  } else {
    what = event;
  }
  std::string text = "gpurun " + m.value("run", std::string("run")) + " on " +
                     m.value("host", std::string("?")) + ": " + what;
  if (const std::string spent = money(m); !spent.empty()) text += "; " + spent;
  return text;
}

}  // namespace gpurun

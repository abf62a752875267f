#include "train/resume_check.h"

#include <cstdint>
#include <exception>
#include <vector>

#include "report/metrics_tail.h"

namespace gpurun::detail {

void ResumeCheck::load(const std::string& metrics_path, int64_t resumed_step,
                       const nlohmann::json& numerics) {
  logged_.clear();
  compared_ = 0;
  logged_steps_ = 0;
  finished_ = false;
  reason_ = "no step of the stopped run after the checkpoint is in its metrics.jsonl";
  if (!numerics.value("deterministic", true)) {
    reason_ = "the device is not deterministic (train.deterministic is false)";
    return;
  }
  try {
    const std::vector<std::string> lines = complete_lines_in_tail(metrics_path, kTailBytes);
    std::map<int64_t, double> logged;
    // Back from the end to the stopped process's plan event: its step events are those after it.
    for (auto line = lines.rbegin(); line != lines.rend(); ++line) {
      const nlohmann::json e = nlohmann::json::parse(*line, nullptr, /*allow_exceptions=*/false);
      if (!e.is_object() || !e.contains("event") || !e["event"].is_string()) continue;
      const std::string event = e["event"].get<std::string>();
      if (event == "step") {
        // A line that is not one of gpurun's step events (edited, damaged) is passed over.
        const auto step = e.find("global_step");
        const auto loss = e.find("loss");
        if (step == e.end() || !step->is_number_integer() || loss == e.end() || !loss->is_number())
          continue;
        if (step->is_number_unsigned() && step->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
          continue;
        if (step->get<int64_t>() > resumed_step)
          logged.emplace(step->get<int64_t>(), loss->get<double>());
        continue;
      }
      if (event != "plan") continue;
      logged_steps_ = static_cast<int64_t>(logged.size());
      if (logged.empty()) return;
      if (!e.contains("numerics")) {
        // A plan without it: an out-of-memory fallback (its steps ran at another micro-batch)
        // or a gpurun that did not record it.
        reason_ = "the stopped run's last plan event records no numerics";
        return;
      }
      if (e["numerics"] != numerics) {
        reason_ = "the stopped run computed with other numerics: " + e["numerics"].dump() +
                  " against " + numerics.dump();
        return;
      }
      logged_ = std::move(logged);
      reason_.clear();
      return;
    }
    logged_steps_ = static_cast<int64_t>(logged.size());
    if (!logged.empty()) reason_ = "the stopped run's plan event is not in metrics.jsonl's tail";
  } catch (const std::exception& e) {
    logged_.clear();
    reason_ = std::string("metrics.jsonl could not be read: ") + e.what();
  }
}

std::optional<nlohmann::json> ResumeCheck::observe(int64_t step, double loss) {
  if (!active()) return std::nullopt;
  const auto it = logged_.find(step);
  if (it == logged_.end()) return std::nullopt;
  ++compared_;
  nlohmann::json verdict = {{"compared_steps", compared_},
                            {"first_step", logged_.begin()->first},
                            {"last_step", logged_.rbegin()->first}};
  // Bit for bit: the same computation gives the same double, and JSON kept all of its bits.
  if (loss != it->second) {
    finished_ = true;
    verdict.update(
        {{"exact", false}, {"global_step", step}, {"logged_loss", it->second}, {"loss", loss}});
    return verdict;
  }
  if (step != logged_.rbegin()->first) return std::nullopt;
  finished_ = true;
  verdict["exact"] = true;
  return verdict;
}

}  // namespace gpurun::detail

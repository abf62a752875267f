// The resume check: a process resumed from a checkpoint retrains the steps that the stopped
// process had done after that checkpoint, and logs their losses again. Where both processes
// computed with the same numerics (the same run, config, plan, threads, CPU and a
// deterministic device), an exact resume logs the very same bits; the check compares them, so that
// every resume of every run proves itself exact, or names the first step where it is not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace gpurun::detail {

class ResumeCheck {
 public:
  /// How far back from the end of metrics.jsonl the stopped process's events are looked for:
  /// a checkpoint interval's step events are far fewer bytes.
  static constexpr size_t kTailBytes = size_t{16} << 20;

  /// Reads, from the end of `metrics_path`, the step events that the process before this one
  /// logged after `resumed_step` (global step), back to its plan event. They are kept for the
  /// comparison only when that plan event's `numerics` equals `numerics` (the object this
  /// process puts in its own plan event: it holds the run's id, so that another run sharing the
  /// run directory is never compared with) and `numerics["deterministic"]` is
  /// not false; otherwise `reason()` says why nothing is compared. Lines that are not step or
  /// plan events with the expected types are passed over. Never throws: a missing or unreadable
  /// file means nothing to compare.
  void load(const std::string& metrics_path, int64_t resumed_step, const nlohmann::json& numerics);

  /// Whether any step is left to compare.
  bool active() const { return !logged_.empty() && !finished_; }
  /// Why load() found nothing to compare ("" when it did).
  const std::string& reason() const { return reason_; }
  /// How many step events of the stopped run after the checkpoint load() found, compared or
  /// not: where some were found but not compared, the reason is worth telling.
  int64_t logged_steps() const { return logged_steps_; }

  /// This process's step event at `step` with interval mean loss `loss`. Returns the verdict,
  /// as the fields of a resume_check event, once: at the first step whose loss differs from the
  /// logged one (exact: false), or once the stopped process's last logged step is compared
  /// (exact: true). Fields: exact, compared_steps, first_step, last_step, and on a difference
  /// global_step, logged_loss (the stopped process's) and loss (this one's).
  std::optional<nlohmann::json> observe(int64_t step, double loss);

 private:
  std::map<int64_t, double> logged_;  ///< global step -> interval mean loss, of the stopped run
  std::string reason_;
  int64_t compared_ = 0;
  int64_t logged_steps_ = 0;
  bool finished_ = false;
};

}  // namespace gpurun::detail

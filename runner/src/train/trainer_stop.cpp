// The stop at a step boundary (train/trainer_loop.h): a stop signal, another rank's, or the
// cloud's preemption notice (util/stop_notice.h, launch/notice_watcher.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <optional>
#include <string>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "gpurun/errors.h"
#include "train/scheduler_job.h"
#include "train/trainer_loop.h"
#include "util/clock.h"
#include "util/signals.h"
#include "util/stop_notice.h"

namespace gpurun::detail {

void Trainer::stop_if_signalled(std::optional<bool> agreed) {
  int sig = stop_signal();
  if (comm_) {
    const bool stop =
        agreed ? *agreed : comm_->all_reduce({sig != 0 ? 1.0 : 0.0}, Collectives::Op::kMax)[0] > 0;
    if (!stop) return;
    if (!sig) sig = SIGTERM;  // another rank's signal
  }
  if (!sig) return;
  reporter_.end_progress();
  const auto signalled = std::chrono::steady_clock::now();
  // This machine's notice, if a notice is the cause (one process of each machine watches).
  const std::optional<StopNotice> notice = stop_notice();
  const std::string cause =
      notice ? "a preemption notice, " + notice->describe() : "signal " + signal_name(sig);
  const bool saved = checkpointer_.saved(global_step_);
  if (saved)
    spdlog::warn("received {} at global step {}, which needs no new checkpoint; stopping", cause,
                 global_step_);
  else
    spdlog::warn("received {}; saving at global step {} and stopping", cause, global_step_);
  // A signal's event comes first: a SIGKILL may follow it within seconds. A notice's comes once
  // the checkpoint is safe, whose time it records; its deadline leaves room for that.
  if (!notice)
    reporter_.event(
        "signal",
        {{"signal", sig}, {"global_step", global_step_}, {"job", job_json(options_.job)}});
  if (!saved) save("signal", epoch_, position_);
  checkpointer_.drain();
  // What the grace time leaves after the local save goes to the network copy. A notice gives
  // until its deadline, less the time to exit; the grace still applies past it, as the machine's
  // shutdown at the deadline sends SIGTERM and waits the grace before it kills.
  double copy_seconds = config_.checkpoint.grace_seconds - seconds_since(signalled);
  if (notice)
    copy_seconds =
        std::max(copy_seconds, notice->deadline - unix_seconds() - kNoticeExitMarginSeconds);
  const bool copied = checkpointer_.settle_tiers(copy_seconds);
  // Safe: the state after this step is complete in the last tier (nothing to save at step 0).
  bool safe = rank_ == 0 &&
              (global_step_ == 0 || (copied && checkpointer_.last_complete_step() == global_step_));
  if (notice && rank_ == 0) {
    nlohmann::json safe_seconds;  // null: not safe in the last tier
    if (safe) safe_seconds = std::round(seconds_since(notice->noticed_clock) * 1000) / 1000;
    reporter_.event("signal", {{"signal", sig},
                               {"global_step", global_step_},
                               {"notice", notice->to_json()},
                               {"safe_seconds", safe_seconds},
                               {"job", job_json(options_.job)}});
  }
  if (rank_ == 0 && global_step_ > 0)
    spdlog::warn("stopping: {}", checkpointer_.not_saved(global_step_));
  // Every rank ends once rank 0's checkpoint is complete, so that the job's exit 75 means the
  // checkpoint is there, and learns whether it is safe, for its own machine's notice.
  if (comm_) safe = comm_->all_reduce({safe ? 1.0 : 0.0}, Collectives::Op::kMax)[0] > 0;
  if (notice && notice->acknowledge) {
    if (safe)
      notice->acknowledge();
    else
      spdlog::warn(
          "the {} event {} is not acknowledged: the checkpoint is not safe in the last tier; the "
          "event starts at {} instead",
          notice->cloud, notice->event_id, utc_text(notice->deadline));
  }
  if (notice) throw Stopped(sig, "a preemption notice, " + notice->describe());
  throw Stopped(sig);
}

}  // namespace gpurun::detail

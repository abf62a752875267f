// A stop asked for by a notice rather than a signal: the cloud's metadata service announced
// that it takes the machine back (launch/notice_watcher.h). The watcher records the notice
// here and requests a stop as SIGTERM would (util/signals.h), so that the trainer's usual stop
// runs at the next step boundary; the trainer reads the notice to give the copy to the network
// tier the time the notice leaves, to record it in the `signal` event, and to acknowledge it
// once the checkpoint is safe. Kept apart from signals.h, whose handlers must stay
// async-signal-safe: a notice carries strings and a callback.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace gpurun {

struct StopNotice {
  std::string cloud;  ///< "aws", "gcp" or "azure"
  /// The cloud's own word for what comes: AWS spot's action ("terminate", "stop",
  /// "hibernate") or a scheduled event's code ("system-reboot"), GCP's "preempted" or
  /// maintenance event ("TERMINATE_ON_HOST_MAINTENANCE"), Azure's EventType ("Preempt").
  std::string kind;
  std::string event_id;  ///< the event's id where the cloud gives one (Azure, AWS scheduled)
  double deadline = 0;   ///< unix seconds when the machine is taken: the notice's, or its default
  double noticed = 0;    ///< unix seconds when gpurun saw the notice
  std::chrono::steady_clock::time_point noticed_clock = std::chrono::steady_clock::now();
  /// Tells the cloud the machine may go now (Azure's StartRequests); empty where the cloud has
  /// no such call. Called at most once, on the training thread, once the checkpoint is safe;
  /// it waits a few seconds at most and throws nothing.
  std::function<void()> acknowledge;

  /// Seconds from the notice to its deadline (negative when it came late).
  double seconds_left_at_notice() const { return deadline - noticed; }
  /// "aws spot terminate at 2026-03-01T12:00:05Z (118 s after the notice)".
  std::string describe() const;
  /// The `signal` event's `notice`: cloud, kind, event_id (when known), deadline and noticed
  /// as ISO 8601 UTC, seconds_left (at the notice).
  nlohmann::json to_json() const;
};

/// Seconds a stop leaves itself, after the copy to the network tier, to exit before a notice's
/// deadline: the lease's release, the last events and the process's end.
inline constexpr double kNoticeExitMarginSeconds = 5;

/// Records `notice` (the first one wins) and requests a stop with SIGTERM (request_stop()), so
/// that stop_signal() is non-zero from now on. Thread-safe.
void request_stop_for_notice(StopNotice notice);

/// The notice recorded by request_stop_for_notice(), if any. Thread-safe.
std::optional<StopNotice> stop_notice();

/// Forgets a recorded notice (tests); the stop signal is cleared by clear_stop_signal().
void clear_stop_notice();

}  // namespace gpurun

// What a run tells the user and the tools watching it (docs/architecture.md, "Run directory"):
// metrics.jsonl (one event a line), the same events' scalars as TensorBoard files
// (tensorboard_writer.h), status.json (replaced atomically at least every 10 s),
// and a progress line on stderr that refreshes in place on a terminal and prints plain
// periodic lines when stderr is a file. On a terminal, every log line clears the progress
// line first and draws it again after, so that the screen never keeps a stale one.
// metrics.jsonl and status.json are written by a background thread (file_writer.h): slow
// storage never stalls training over them. The heartbeat is written in place (no fsync, at
// most once a second), so that a rank killed outright leaves the step it reached.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spdlog::sinks {
class sink;
}

namespace gpurun {

template <class T>
class DetachedCall;

class BackgroundFileWriter;
class ProgressLine;
class TensorBoardWriter;

/// Thread-safe: a stop that cannot wait for the training thread records itself from another
/// one (signals.h, set_immediate_stop_action).
class Reporter {
 public:
  /// `run_dir` is created when missing. With `enabled` false (ranks other than 0) nothing is
  /// written but the heartbeat of `rank`. On a terminal, wraps the default logger's console
  /// sinks so that log lines clear and redraw the progress line. Throws IoError.
  Reporter(std::string run_dir, bool enabled, int rank = 0);
  /// Writes the heartbeat's last step if the file does not hold it yet (flush_heartbeat), and
  /// gives the logger its sinks back.
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  /// Appends {"event": name, "time": unix seconds, ...fields} to metrics.jsonl, and its scalars
  /// to the TensorBoard file. "time" is the
  /// call's moment unless `fields` has its own (the moment the caller measured, e.g. a step's
  /// end, so that rates computed from the times agree with the rates reported). On every
  /// rank, first brings the heartbeat up to date (flush_heartbeat): an event marks a moment
  /// (a save, a stop, the end) whose step the launcher may report.
  void event(const std::string& name, nlohmann::json fields);

  /// Replaces RUN_DIR/`name` with `data` from the background writer (rank 0 only): the
  /// resolved config.json that `gpurun report` shows.
  void write_file(const std::string& name, const std::string& data);

  /// Merges `fields` into the status and rewrites status.json when `force` or when the last
  /// write is 10 s old or more. Adds pid, host and the update time.
  void status(const nlohmann::json& fields, bool force = false);

  /// The end of the run: the `done` event with `done_fields`, then status.json with
  /// `status_fields` merged, written at once. Only the first call writes (false for the
  /// others), so that the training thread and an immediate stop never record two ends.
  /// Waits (at most 5 s) until both are written: the process may exit at once after it.
  bool end_run(const nlohmann::json& done_fields, const nlohmann::json& status_fields);

  /// Shows "epoch 2/5  step 340/1170  loss 0.4123  812 samples/s  ETA 3m12s"; on a terminal
  /// in place at most every 0.25 s, otherwise one line at most every 10 s (or when `force`).
  void progress(const std::string& line, bool force = false);
  /// Rewrites heartbeat_path(run_dir, rank) with "step N" (at most once a second): the
  /// launcher's hang watchdog reads its change as proof of progress, and its failure report
  /// the step a rank had reached. A step not written for the throttle is written by the next
  /// event() or by the destructor, so that a rank that saves, stops or exits leaves the step
  /// it really reached (one killed outright: the step of at most a second before).
  void heartbeat(int64_t global_step);
  /// Called (rank 0 only) after every event() with its name, the line written and the status so
  /// far, under the reporter's lock: it must not block (the run's messages queue theirs,
  /// notify/notifier.h). Set before the first event.
  using Observer = std::function<void(const std::string& name, const nlohmann::json& line,
                                      const nlohmann::json& status)>;
  void set_observer(Observer observer) { observer_ = std::move(observer); }

  /// Writes the last step given to heartbeat() when the file does not hold it yet.
  void flush_heartbeat();

  /// Erases an in-place progress line for good (until the next progress()): before the run's
  /// last words, so that no progress line is drawn after them.
  void end_progress();

  const std::string& run_dir() const { return run_dir_; }

 private:
  std::string run_dir_;
  bool enabled_;
  std::string heartbeat_path_;
  /// The heartbeat's write in progress, waited for at most kHeartbeatWaitSeconds.
  std::shared_ptr<DetachedCall<bool>> heartbeat_write_;
  static constexpr double kHeartbeatWaitSeconds = 0.2;
  int64_t heartbeat_step_ = -1;  ///< the last step given to heartbeat(), -1 before the first
  int64_t written_step_ = -1;    ///< the step the heartbeat file holds, -1 when none written
  bool tty_;
  bool ended_ = false;  ///< end_run() wrote the done event
  Observer observer_;
  nlohmann::json status_ = nlohmann::json::object();
  std::chrono::steady_clock::time_point last_status_{}, last_progress_{}, last_heartbeat_{};
  std::recursive_mutex mutex_;  ///< everything above; recursive for end_run's event + status
  std::unique_ptr<BackgroundFileWriter> files_;     ///< writes every file of the run directory
  std::unique_ptr<TensorBoardWriter> tensorboard_;  ///< RUN_DIR/tensorboard/; null off rank 0
  std::shared_ptr<ProgressLine> line_;  ///< the terminal's progress line; null off a terminal
  /// The logger's sinks before they were wrapped, restored by the destructor.
  std::vector<std::shared_ptr<spdlog::sinks::sink>> original_sinks_;

  void write_heartbeat();
};

/// RUN_DIR/heartbeat for rank 0, RUN_DIR/heartbeat-rank-R for the others.
std::string heartbeat_path(const std::string& run_dir, int rank);

/// The global step in a heartbeat file, -1 when it is missing or unreadable.
int64_t read_heartbeat_step(const std::string& path);

}  // namespace gpurun

// The state of `gpurun queue` in its directory (docs/architecture.md, "Queue directory"):
//
//   DIR/queue.json        every run's state; replaced atomically on every change
//   DIR/queue.lock        flock(2)ed by the live queue; names its pid and host
//   DIR/runs/NAME/        one run's checkpoint and run directory, stdout.log, stderr.log
//   DIR/summary.csv/.json the end's table
//
// It lives beside the checkpoints, on the same storage, so that a reclaimed machine's
// successor finds both. A run's own metrics.jsonl is the truth of "finished" (a `done` event
// with exit_code 0): a queue killed between its child's exit and the write of queue.json
// still never trains a finished run again. No Torch headers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/storage/store.h"

namespace gpurun {

/// pending: not started; running: a child trains it (or did, when the queue died);
/// interrupted: stopped by a signal or waiting for its restart, resumed next; finished: exit 0;
/// failed: a final failure (exit 2 or 3, or restarts used up).
enum class RunState { kPending, kRunning, kInterrupted, kFinished, kFailed };

/// "pending", "running", "interrupted", "finished", "failed".
const char* run_state_name(RunState state) noexcept;

/// One run's record in queue.json.
struct RunRecord {
  std::string name;
  std::optional<int64_t> seed;
  std::string config;             ///< absolute path
  std::vector<std::string> sets;  ///< the run's --set list as the queue file gives it
  /// What the queue adds (train.threads on CPU), fixed at the first start for every resume.
  std::vector<std::string> queue_sets;
  RunState state = RunState::kPending;
  int exit_code = -1;       ///< of the last attempt; -1 before any, or killed by a signal
  int signal = 0;           ///< the signal that ended the last attempt, 0 when it exited
  int restarts = 0;         ///< restarts after a failure (not resumes after a stop)
  int attempts = 0;         ///< children started, over every queue invocation
  double started = 0;       ///< unix seconds of the first start; 0 before it
  double ended = 0;         ///< unix seconds of the last attempt's end; 0 before it
  double wall_seconds = 0;  ///< the ended attempts' time added up (run_wall_seconds(): so far)
  /// Unix seconds of the running attempt's start; 0 when none runs. A queue killed outright
  /// leaves it set: the next queue adds that attempt's time (attempt_end_of()).
  double attempt_started = 0;
  int64_t pid = 0;     ///< the running child's pid; 0 when none
  std::string device;  ///< "cuda:N" (its CUDA_VISIBLE_DEVICES) or "cpu"
  std::string error;   ///< why it failed, one line; "" otherwise
};

/// queue.json.
struct QueueState {
  std::string queue_file;  ///< the QUEUE.yaml path as given
  std::string host;        ///< the live (or last) queue's host
  int64_t pid = 0;         ///< and pid
  int parallel = 1;
  double updated = 0;     ///< unix seconds of the last write
  bool stopping = false;  ///< a stop signal arrived; no new run starts
  std::vector<RunRecord> runs;
};

nlohmann::json to_json(const QueueState& state);

/// Throws Error when `j` is not a queue.json of this format.
QueueState queue_state_from_json(const nlohmann::json& j);

/// DIR/queue.json; nullopt when it does not exist. Throws Error when it does not parse,
/// IoError when it cannot be read.
std::optional<QueueState> read_queue_state(const std::string& dir);

/// Replaces DIR/queue.json atomically (temporary file, fsync, rename, fsync of DIR). Throws
/// IoError.
void write_queue_state(const std::string& dir, QueueState& state);

/// DIR/runs/NAME: the run's checkpoint and run directory.
std::string run_dir_of(const std::string& dir, const std::string& name);

/// Unix seconds of the last sign of life of the attempt of `r` that started at
/// `r.attempt_started` and whose queue died without recording its end (SIGKILL): the newest
/// modification of its run directory's logs, metrics.jsonl, status.json and heartbeat, at
/// least `r.attempt_started` and at most now. Throws nothing.
double attempt_end_of(const std::string& dir, const RunRecord& r);

/// The time run `r` of queue directory DIR has trained so far: its ended attempts' time, plus,
/// while an attempt runs, the time since it started (`queue_live`), or, under a queue that is
/// gone, up to attempt_end_of().
double run_wall_seconds(const std::string& dir, const RunRecord& r, bool queue_live);

/// What a run's metrics.jsonl says of its end.
struct RunMetrics {
  std::optional<int> done_exit_code;            ///< the last `done` event's exit_code
  std::optional<nlohmann::json> last_epoch;     ///< the last `epoch` event
  std::optional<int64_t> last_checkpoint_step;  ///< the last `checkpoint` event's global_step
};

/// Reads RUN_DIR/metrics.jsonl (missing: nothing known); lines that do not parse are skipped
/// (a line cut by a SIGKILL). Throws nothing.
RunMetrics read_run_metrics(const std::string& run_dir);

/// The checkpoint directory of the run whose run directory is RUN_DIR: RUN_DIR itself when it
/// holds a LATEST (the default --ckpt; also a run directory copied or moved elsewhere, whose
/// status.json still names the old place), else the folder of status.json's
/// last_network_checkpoint or last_checkpoint (--run-dir apart from --ckpt), else RUN_DIR.
/// Throws nothing.
std::string checkpoint_dir_of(const std::string& run_dir);

/// What a run's checkpoints say of the state it saved last.
struct RunCheckpoints {
  std::string dir;            ///< checkpoint_dir_of(run_dir)
  CheckpointSummary summary;  ///< of `dir` (checkpoint/store.h)
  /// Why the newest state the run saved cannot be resumed or exported as it is, "" when it can
  /// (or the run saved nothing yet): its newest checkpoint does not verify, a newer one was set
  /// aside as damaged, or, for a run whose last `done` is exit 0, none is left or the newest is
  /// older than its final one (the last `checkpoint` event of metrics.jsonl).
  std::string problem;
};

/// Checks RUN_DIR's checkpoints: with `verify` the checksums of the newest (the queue's check of
/// a finished run before it is skipped), without only manifests and sizes (`gpurun status` and
/// `gpurun report`, which must stay quick). Throws IoError when the checkpoint directory cannot
/// be listed, or (`verify`) a file read fails.
RunCheckpoints check_run_checkpoints(const std::string& run_dir, bool verify);

}  // namespace gpurun

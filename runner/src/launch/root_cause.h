// How a worker of the supervisor (supervisor.h) ended, and the report that blames one: among
// the workers of a group, the first failure is the root cause, named with its rank, its exit
// code or signal, the step it had reached and the last lines of its stderr, as torchelastic's
// agent reports the first failure of a group (torch/distributed/elastic/multiprocessing/
// errors). No Torch headers here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpurun {

/// How one run of a worker ended.
struct WorkerExit {
  std::string name;            ///< the Worker's name ("rank 1"); "worker" for a lone one
  int64_t step = -1;           ///< global step from its heartbeat file; -1 when unknown
  int exit_code = -1;          ///< the exit status; -1 when killed by a signal
  int signal = 0;              ///< the signal that killed it, 0 when it exited
  bool hung = false;           ///< killed by the watchdog
  std::string last_lines;      ///< the last ~20 lines of its stderr, '\n'-separated
  double seconds = 0;          ///< how long it ran (wall clock)
  double stalled_seconds = 0;  ///< when hung: seconds without progress before the kill
  /// Unix seconds when it failed: the time its error report gives (util/error_report.h), else
  /// when it was reaped.
  double failed_at = 0;
  /// Its error report says a collective failed: a reaction to a peer's failure.
  bool peer_failure = false;
  /// Its error report says another live run holds the checkpoint directory (LeaseHeld).
  bool lease_held = false;
  /// The supervisor signalled it (after another worker failed, or to forward a stop).
  bool stopped = false;
};

/// Whether an exit is retried: killed by a signal (SIGKILL from the OOM killer included), hung,
/// or an exit code not in {0, 2, 3, 4, 75}.
bool should_restart(const WorkerExit& e);

/// The last "gpurun error ..." line of its stderr, without the prefix; "" when none.
std::string error_line(const WorkerExit& e);

/// Whether `now` is the failure `before` was, again: an exit code (not a signal or a hang),
/// the same code, at the same known step, with the same error line. A restart resumes the same
/// checkpoint and data, so a failure that repeats this way would repeat on every restart.
bool repeats(const WorkerExit& now, const WorkerExit& before);

/// "exited with code 1", "killed by signal 9 (SIGKILL)", "hung: no progress for 30 s".
std::string describe(const WorkerExit& e);

/// describe() with the worker's name and step: "rank 1 killed by signal 9 (SIGKILL) at step
/// 412", "worker exited with code 1" (no step known).
std::string cause(const WorkerExit& e);

/// " (a SIGKILL nobody asked for is often the kernel's OOM killer: see dmesg)" for a SIGKILL
/// that was not the watchdog's, "" otherwise.
std::string kill_hint(const WorkerExit& e);

/// The worker's last stderr lines for a log message: "\n  | line" each, or " (none)".
std::string last_lines_block(const WorkerExit& e);

/// Among `ended`, indices into `exits` of workers reaped in the same poll, the likeliest root
/// cause: a failure (neither exit 0 nor exit 75) with the highest severity, a death by a
/// signal before an exit code other than 1 before exit 1 (a peer's death makes the others'
/// collectives fail with 1), then the first in `ended`. Returns -1 when none of them failed.
int root_cause_among(const std::vector<WorkerExit>& exits, const std::vector<int>& ended);

/// The root cause once every worker of a group is reaped: among the failures, the first in time
/// (failed_at) that is neither a reaction to a peer (peer_failure) nor a worker the supervisor
/// killed (stopped, and dead by a signal); `first` (the first failure reaped,
/// root_cause_among()) when there is none, as when every rank saw its collectives fail (a
/// partition).
int root_cause_of(const std::vector<WorkerExit>& exits, int first);

/// The exit that stands for a group's run once every worker is reaped: the root cause `root`
/// (-1: none), else the first worker stopped by exit 75 or killed by a signal, else the first
/// worker. `exits` must not be empty.
int outcome_of(const std::vector<WorkerExit>& exits, int root);

}  // namespace gpurun

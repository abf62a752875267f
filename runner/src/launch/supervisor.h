// The supervisor behind `gpurun --max-restarts N --hang-timeout SECONDS` and the launcher behind
// `--nproc-per-node N`: it runs training in child processes (the same gpurun re-executed with
// --resume), one per local rank, and restarts them all with exponential backoff after a crash,
// as torchelastic's agent does (torch/distributed/elastic/agent/server/api.py: WorkerState,
// max_restarts). When one worker of a group fails, the others get SIGTERM and, after
// stop_timeout seconds, SIGKILL; the first failure is reported as the root cause with its rank,
// exit code or signal, the step it had reached and the last lines of its stderr.
//
// Contract with the child (docs/architecture.md, "Worker environment" and "Exit codes"):
// - GPURUN_RESTART_COUNT=k in its environment: 0 for the first run, k for the k-th restart.
// - Exit 0 ends supervision; exit 2 (usage/config) and 3 (cannot resume) are never retried;
//   exit 75 (stopped by a signal) and 4 (stopped at cost.budget) are returned as is; any other
//   exit, a death by a signal (the OOM killer's SIGKILL included) and a hang are retried up to
//   max_restarts times.
// - Progress: the child rewrites a heartbeat file (RUN_DIR/heartbeat, "step N") as it trains,
//   at most once a second, and once more with its final step when it stops, saves or exits;
//   no change of its mtime or size for hang_timeout seconds counts as a hang. The time the
//   child needs before its first step (loading data, a checkpoint) counts too.
// - The child runs in its own process group with stdout inherited and stderr piped through the
//   supervisor (echoed as it comes, the last lines kept for the failure report). A stop signal
//   received by the supervisor (gpurun::stop_signal()) is forwarded to the child (SIGINT as
//   SIGTERM), whose exit code (75 when it saved) is returned without a restart.
//
// No Torch headers here: this file is included by the command line and compiles fast.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launch/root_cause.h"

namespace gpurun {

struct SupervisorOptions {
  /// The child's full argv; argv[0] is the path of the binary (execv: no PATH search). The
  /// caller includes --resume and leaves out --max-restarts/--hang-timeout.
  std::vector<std::string> argv;
  /// Restarts allowed after the first run (0: a failure is final).
  int max_restarts = 0;
  /// Seconds without progress after which the child's process group is killed (SIGKILL: a hung
  /// process may not handle SIGTERM) and the run counts as failed; 0 turns the watchdog off.
  double hang_timeout = 0;
  /// The heartbeat file of the child (of a group's first worker: RUN_DIR/heartbeat); required
  /// when hang_timeout > 0, also used for the backoff when set, and read for the step a lone
  /// worker reached (a group's workers name their own). Only a change of its mtime or size
  /// seen during this run counts: a file left by an earlier run does not, and a file server's
  /// clock that differs from ours does not matter (NFS).
  std::string progress_file;
  /// Seconds before the first restart; doubles per failure without progress in between (a run
  /// whose heartbeat advanced resets it), capped at backoff_max.
  double backoff_initial = 1.0;
  double backoff_max = 60.0;
  /// Extra environment for the child, over the supervisor's own.
  std::map<std::string, std::string> env;
  /// One worker of a group started together (a rank): extra environment over `env`, a name for
  /// messages ("rank 1") and its heartbeat file (report/reporter.h heartbeat_path), read for the
  /// step it reached once it has exited.
  struct Worker {
    std::map<std::string, std::string> env;
    std::string name;
    std::string heartbeat_file;
  };
  /// The group; empty means one worker with `env` only. Only the first worker's stderr is
  /// echoed to ours (the others write their own log files); all are kept for failure reports.
  std::vector<Worker> workers;
  /// Seconds the other workers get to exit after SIGTERM once one has failed, before SIGKILL.
  double stop_timeout = 15;
  /// Called after each run of the child, before deciding on a restart (tests, status.json).
  std::function<void(const WorkerExit&)> on_worker_exit;
  /// The run's messages the workers cannot send (notify/notifier.h): "stalled" when the
  /// watchdog kills a hung group ({stalled_seconds, step}), and "failed" once, when the run
  /// ends failed for good: restarts used up, a failure that would repeat, an exit 2 or 3, a
  /// binary that cannot run ({error, cause, restarts}). Not for a failure a restart recovers.
  std::function<void(const std::string& event, const nlohmann::json& details)> notify;
};

/// The state of the group during one run: starting, running, then how the run ended (as
/// torchelastic's WorkerState); every transition is logged.
enum class WorkerState { kStarting, kRunning, kSucceeded, kFailed, kStopped, kHung };

/// "starting", "running", "succeeded", "failed", "stopped", "hung".
const char* state_name(WorkerState state) noexcept;

/// Runs the child (or the group) until it finishes, restarting it per the rules above, and
/// returns the exit code gpurun should exit with: 0 when every worker exited 0; the root
/// cause's 2 or 3; 75 when a worker exited 75 and none failed; after a stop signal, no restart:
/// 75 when the root cause was killed by a signal, else its own exit code; 75 when a stop
/// signal arrives before a run or during the backoff; 1 when the restarts are used up or the
/// binary cannot be executed (an exec failure is not retried). Logs each failure with its cause,
/// its step and the child's last stderr lines. Throws std::invalid_argument for an empty argv, a
/// negative max_restarts or hang_timeout, hang_timeout without progress_file, or a backoff outside
/// 0 <= backoff_initial <= backoff_max; IoError when pipe(2), fork(2) or waitpid(2) fails. Call it
/// from the main thread: the child is started with PR_SET_PDEATHSIG(SIGTERM), which fires when the
/// forking thread ends, so that a supervisor killed outright still makes its child save and exit.
int supervise(const SupervisorOptions& options);

}  // namespace gpurun

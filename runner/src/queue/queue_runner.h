// The scheduler of `gpurun queue QUEUE.yaml --dir DIR [--parallel N] [--max-restarts N]`
// (docs/architecture.md, "Queue"): every run of the queue file is a child process of the
// gpurun binary,
//
//   gpurun run CONFIG --ckpt DIR/runs/NAME --resume --set ... [--set train.threads=T]
//
// with its stdout and stderr appended to DIR/runs/NAME/stdout.log and stderr.log, at most N at
// a time. The state (queue_state.h) is written to DIR/queue.json on every change, so that the
// same command after a reclaim skips the finished runs, resumes the interrupted ones at their
// checkpoints (--resume) and starts the rest.
//
// Rules:
// - A child that exits 0 is finished. Exit 2 (config error) and 3 (cannot resume) fail the run
//   at once: retrying cannot help (docs/architecture.md, "Exit codes"). Any other exit and a
//   death by a signal the queue did not send are restarted with --resume up to max_restarts
//   times (1 s, 2 s, 4 s, ... apart, at most 30 s; the other slots go on meanwhile), then fail
//   the run. A failed run never stops the others; the next invocation tries it again (from
//   its checkpoint, if it has one), with its restarts counted afresh. Exit 75 without a
//   stop signal to the queue (someone stopped that run alone) leaves the run interrupted for
//   the next invocation, without a restart now; so does exit 4 (it saved at its cost.budget,
//   which must be raised before another try can spend anything).
// - A stop signal to the queue (SIGTERM, SIGINT, ...; util/signals.h) starts no new run and is
//   forwarded to every running child (SIGINT as SIGTERM: a second SIGINT means "stop without
//   saving"), which saves and exits 75; those runs are recorded interrupted and the queue exits
//   75. Children get PR_SET_PDEATHSIG(SIGTERM) (launch/worker_process.h), so that a queue
//   killed outright still makes each of them save and exit, leaving no process that holds its
//   checkpoint lease for long.
// - Devices: with CUDA devices (cuda_devices()), slot i's child gets CUDA_VISIBLE_DEVICES set
//   to the (i mod count)-th; on CPU with N > 1 each child gets train.threads =
//   max(1, CPUs / N) (the CPUs of our affinity mask: a container's or Slurm's) unless its
//   config or its sets give train.threads. The count is fixed at a run's first start, so that
//   its resumes train with the same threads (bit identity on CPU, docs/architecture.md
//   "Determinism").
// - A finished run (its own `done` exit 0, or queue.json's record) is skipped only when its final
//   checkpoint verifies, checksums read (check_run_checkpoints()): one that does not, one set
//   aside, or none newer than the last it saved sends it back to interrupted, so that it is
//   trained again from its newest good checkpoint (--resume sets the damaged one aside). This
//   reads each finished run's final checkpoint once per invocation.
// - A finished or started run keeps its definition: a queue file that changes a started run's
//   config, or a set of a key in the config hash, is refused (keys outside it, cost.budget
//   among them, may change); a new run added to the file is simply pending.
// - DIR is flock(2)ed (DIR/queue.lock) for the queue's lifetime: a second queue on DIR is
//   refused while the first lives.
//
// No Torch headers. Call from the main thread (PR_SET_PDEATHSIG fires when the forking thread
// ends).
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "queue/queue_file.h"

namespace gpurun {

struct QueueOptions {
  std::string dir;       ///< the queue directory; created when missing
  int parallel = 1;      ///< children at once, >= 1
  int max_restarts = 0;  ///< restarts of a failed run, >= 0
  /// Seconds without a change of a run's heartbeat file (RUN_DIR/heartbeat, report/reporter.h)
  /// after which its process group is SIGKILLed and the attempt counts as failed (restarted
  /// per max_restarts); 0 turns the watchdog off. Loading data and a checkpoint count too.
  double hang_timeout = 0;
  std::string binary;          ///< the gpurun each run runs with (argv[0]: a path, no PATH search)
  double backoff_initial = 1;  ///< seconds before a failed run's first restart
  double backoff_max = 30;     ///< the longest wait before a restart
};

/// Runs the queue until every run is finished or failed, or a stop signal ends it. Prints the
/// summary table to `out` and writes DIR/summary.csv and .json (queue_summary.h). Returns 0
/// when every run finished; 75 when stopped by a signal (the same command continues); else 1
/// when one failed; else 75 when a run was left interrupted; else 4 when the runs left stopped
/// at their cost.budget (not 75, which a scheduler would requeue only to stop again). Throws
/// ConfigError
/// (exit 2) for parallel < 1, max_restarts < 0, hang_timeout < 0, DIR held by a live queue, a
/// DIR/queue.json that does not parse, or a queue file that changes a started run; IoError when DIR
/// cannot be written.
int run_queue(const QueueFile& queue, const QueueOptions& options, std::ostream& out);

}  // namespace gpurun

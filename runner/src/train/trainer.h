// The training loop: epochs of optimizer steps over a per-epoch permutation of the data,
// gradient accumulation over micro-batches, evaluation and a checkpoint after every epoch,
// checkpoints every N steps / N minutes / on a stop signal, and exact resume.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "distributed/worker_env.h"
#include "gpurun/config.h"

namespace gpurun {

class Notifier;
class Registry;

/// How the run was started (the command line, not run.yaml).
/// The scheduler's job a run is part of (launch/slurm.h fills it in under Slurm): its id and
/// requeues go into the plan, resume and signal events and status.json, and its time limit is
/// checked against a step and a save at the start.
struct SchedulerJob {
  std::string scheduler;           ///< "slurm"; empty: none
  std::string job_id;              ///< the scheduler's id of the job
  int64_t restart_count = 0;       ///< times the scheduler requeued the job (SLURM_RESTART_COUNT)
  double time_limit_unix = 0;      ///< when the time limit ends the job (Unix s); 0: none known
  double signal_lead_seconds = 0;  ///< the warning signal comes this long before it; 0: none
  std::string signal;              ///< that signal's name ("SIGUSR1"); empty: none known
};

struct RunOptions {
  std::string ckpt_dir;   ///< checkpoint root; required
  std::string run_dir;    ///< metrics.jsonl, status.json; empty: ckpt_dir
  bool resume = false;    ///< continue from the newest complete checkpoint if there is one
  bool force = false;     ///< take the directory's lease at once, even from a live run
  bool no_lease = false;  ///< write checkpoints without the lease (--no-lease)
  /// Resume although the data changed since the checkpoint (train/resume.h check_data()).
  bool allow_data_change = false;
  std::string device = "auto";  ///< auto | cpu | cuda
  int64_t restart_count = 0;    ///< GPURUN_RESTART_COUNT, reported in status.json
  int64_t memory_limit = 0;     ///< --memory-limit in bytes; 0: memory.capacity or the device
  /// This worker's place in a distributed run (dist_env.h); nullopt: a single process.
  std::optional<DistEnv> dist;
  SchedulerJob job;  ///< the scheduler's job, when one started this run
  /// Sends the run's messages (notify/notifier.h) from rank 0: started, checkpoint_failed,
  /// preempted, finished, budget. Null: none. Owned by the caller, alive during train().
  Notifier* notifier = nullptr;
};

/// Where metrics.jsonl and status.json go: `run_dir`, else the checkpoint directory.
std::string run_dir_or_default(const RunOptions& options);

/// Runs the whole training described by `config`, returning when the last epoch is done.
/// With options.dist, joins the process group first and trains data-parallel: each rank takes a
/// disjoint shard of every optimizer step's window of the same per-epoch permutation, gradients
/// are summed once per optimizer step, rank 0 holds the lease and writes checkpoints and
/// metrics, and every rank loads the checkpoint rank 0 chose.
/// Throws ConfigError (the directory already holds checkpoints and `resume` is off; bad
/// device), ResumeError (no valid checkpoint, changed training keys), IoError (storage), and
/// Stopped after saving when a stop signal arrived, BudgetReached after saving when going on
/// would pass cost.budget (or at once, when a resume finds it spent).
void train(const RunConfig& config, const RunOptions& options, const Registry& registry);

}  // namespace gpurun

// Slurm, as gpurun meets it (docs/architecture.md, "Slurm"): the SLURM_* variables of a step,
// the job a run belongs to, and the signal that warns of the job's end.
//
// A step's variables fill in torchrun's worker contract (distributed/worker_env.h) in one of two
// ways:
//   - one task per node (srun --ntasks-per-node=1, or a batch script's own shell): every task is
//     a launcher for its node, nnodes = SLURM_JOB_NUM_NODES, node rank = SLURM_NODEID, and
//     --nproc-per-node workers;
//   - several tasks per node: every task is a worker, RANK = SLURM_PROCID, LOCAL_RANK =
//     SLURM_LOCALID, WORLD_SIZE = SLURM_NTASKS, LOCAL_WORLD_SIZE from SLURM_TASKS_PER_NODE.
// MASTER_ADDR defaults to the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
// MASTER_PORT to 20000 + SLURM_JOB_ID mod 10000, so that every node computes the same address
// and two jobs that share a node do not collide. Values on the command line or in MASTER_* win.
//
// The warning signal: `sbatch --signal=[{R|B}:]SIG[@TIME]` sends SIG (SIGUSR1 by default) TIME
// seconds (60 by default) before the time limit. gpurun stops on SIGTERM, SIGINT, SIGUSR1,
// SIGUSR2 and SIGHUP already; `--slurm-signal` names the job's signal when it is another one,
// and tells gpurun the lead time. Without the flag, gpurun reads the `#SBATCH --signal` line of
// the job's batch script (`scontrol write batch_script`); a --signal given on sbatch's command
// line is not visible to the job. NCCL 2.12 caught SIGUSR1 for its own debugging (NVIDIA/nccl
// #704; later releases only with NCCL_PROXY_DUMP_SIGNAL set): a multi-node job whose steps get
// the signal (no `B:`) may prefer SIGHUP, as submitit chose.
//
// No Torch headers: the launcher and the command line include this.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "distributed/worker_env.h"

namespace gpurun {

/// True inside a Slurm step (SLURM_JOB_ID, SLURM_PROCID and SLURM_NTASKS are set).
bool in_slurm_step(const Environment& env);

/// True inside a Slurm step that runs several tasks per node: each task is then a worker and
/// worker_env_from_slurm() gives its place.
bool slurm_runs_workers(const Environment& env);

/// The torchrun variables for a Slurm task in a several-tasks-per-node step (see above).
/// Throws ConfigError for missing or malformed SLURM_* variables.
Environment worker_env_from_slurm(const Environment& env);

/// `flags` with what a one-task-per-node Slurm step says filled into the fields left unset:
/// nnodes, node rank, rank 0's host and port (MASTER_ADDR / MASTER_PORT still win over Slurm's).
/// Returns `flags` as they are outside such a step. Throws ConfigError as above.
LaunchFlags with_slurm_launch(LaunchFlags flags, const Environment& env);

/// The first host of a Slurm host list: "gpu[07-09,12],cpu1" -> "gpu07". Throws ConfigError
/// for an empty or malformed list.
std::string first_slurm_host(const std::string& nodelist);

/// Tasks on node `node_id` from SLURM_TASKS_PER_NODE ("2(x3),1": nodes 0-2 run 2, node 3 runs
/// 1). Throws ConfigError for a malformed value or a node beyond it.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id);

/// The job a process runs in.
struct SlurmJob {
  std::string job_id;         ///< SLURM_JOB_ID (an array task's own id)
  int64_t restart_count = 0;  ///< SLURM_RESTART_COUNT: times the job was requeued (0: unset)
};

/// The job from SLURM_JOB_ID and SLURM_RESTART_COUNT; nullopt outside Slurm. Throws
/// ConfigError for a SLURM_RESTART_COUNT that is not a number.
std::optional<SlurmJob> slurm_job(const Environment& env);

/// A --signal value.
struct SlurmSignal {
  int number = 0;            ///< the signal (SIGUSR1, ...)
  double lead_seconds = 60;  ///< sent this many seconds before the time limit (Slurm's default)
  bool batch_shell = false;  ///< `B:`: to the batch shell only, not to the job's steps
};

/// Parses Slurm's --signal syntax, [{R|B}:]SIG[@TIME] (R: also on a reservation's end; SIG a
/// name with or without "SIG", or a number 1..64; TIME in seconds, 0..65535). Throws
/// ConfigError naming the text for anything else.
SlurmSignal parse_slurm_signal(const std::string& text);

/// The value of the last `#SBATCH --signal=...` (or `--signal ...`) line of a batch script's
/// header (the #SBATCH lines before its first command, as sbatch reads them); nullopt when none.
std::optional<std::string> sbatch_signal_line(const std::string& script);

/// What the controller knows of a running job; each field empty where it could not be asked.
struct SlurmJobState {
  std::optional<double> seconds_left;  ///< until the time limit (EndTime - now), >= 0
  std::optional<std::string> signal;   ///< the batch script's #SBATCH --signal, as written
};

/// Asks the controller with `scontrol show job` and `scontrol write batch_script`, each bounded
/// by `timeout_seconds`. A missing scontrol (a container), a refused or slow answer leave the
/// fields empty; never throws.
SlurmJobState query_slurm_job(const std::string& job_id, double timeout_seconds);

}  // namespace gpurun

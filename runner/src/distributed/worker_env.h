// Who this process is in a distributed run, and what the launcher tells its workers.
//
// The worker contract is torchrun's (docs/architecture.md, "Worker environment"): RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GPURUN_RESTART_COUNT. Under Slurm
// (`srun gpurun ...`) the SLURM_* variables fill these in, in one of two ways:
//   - one task per node (srun --ntasks-per-node=1): every task is a launcher for its node,
//     nnodes = SLURM_JOB_NUM_NODES, node rank = SLURM_NODEID, and --nproc-per-node workers;
//   - several tasks per node: every task is a worker, RANK = SLURM_PROCID, LOCAL_RANK =
//     SLURM_LOCALID, WORLD_SIZE = SLURM_NTASKS, LOCAL_WORLD_SIZE from SLURM_TASKS_PER_NODE.
// MASTER_ADDR defaults to the first host of SLURM_JOB_NODELIST, MASTER_PORT to
// 20000 + SLURM_JOB_ID mod 10000, so that every node computes the same address and two jobs
// that share a node do not collide. Values given on the command line or as MASTER_* win.
//
// No Torch headers: the launcher and the command line include this.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace gpurun {

using Environment = std::map<std::string, std::string>;

/// This process's environment as a map.
Environment current_environment();

/// A worker's place in the job.
struct DistEnv {
  int rank = 0;              ///< 0 .. world_size-1; rank 0 writes checkpoints and metrics
  int local_rank = 0;        ///< index on this node (the CUDA device it uses)
  int world_size = 1;        ///< workers in the job
  int local_world_size = 1;  ///< workers on this node
  std::string master_addr = "127.0.0.1";  ///< host of rank 0's rendezvous store
  int master_port = 29500;                ///< its TCP port
};

/// The worker's DistEnv when WORLD_SIZE is set (by gpurun's launcher, torchrun, or Slurm with
/// several tasks per node); nullopt for a single process. Throws ConfigError naming the
/// variable for a missing or inconsistent value (RANK >= WORLD_SIZE, a non-number, ...).
std::optional<DistEnv> worker_env(const Environment& env);

/// What the launcher starts on this node.
struct LaunchSpec {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

/// Command-line values; an unset field (nullopt) is filled from Slurm or the defaults.
struct LaunchFlags {
  std::optional<int> nproc_per_node, nnodes, node_rank, master_port;
  std::optional<std::string> master_addr;
};

/// Resolves the launch: flags first, then MASTER_ADDR/MASTER_PORT, then Slurm's variables when
/// this is a one-task-per-node Slurm step, then the defaults. Throws ConfigError for
/// values out of range (node_rank >= nnodes, port outside 1..65535, nproc < 1).
LaunchSpec resolve_launch(const LaunchFlags& flags, const Environment& env);

/// True inside a Slurm step that runs several tasks per node: each task is then a worker and
/// worker_env_from_slurm() gives its place.
bool slurm_runs_workers(const Environment& env);

/// The torchrun variables for a Slurm task in a several-tasks-per-node step (see above).
/// Throws ConfigError for missing SLURM_* variables.
Environment worker_env_from_slurm(const Environment& env);

/// A TCP port on this host that is free now (the kernel's pick for port 0). A single-node job
/// without --master-port or MASTER_PORT uses one, so that two jobs on one machine (two users
/// of a lab box, parallel tests) never collide on 29500. Throws IoError when no socket opens.
int find_free_port();

/// True when --master-port or MASTER_PORT (or Slurm's job id) fixes the port.
bool master_port_given(const LaunchFlags& flags, const Environment& env);

/// The variables of worker `local_rank` (0 .. nproc_per_node-1) of `spec`'s node.
Environment worker_variables(const LaunchSpec& spec, int local_rank);

/// The first host of a Slurm host list: "gpu[07-09,12],cpu1" -> "gpu07". Throws ConfigError
/// for an empty or malformed list.
std::string first_slurm_host(const std::string& nodelist);

/// Tasks on node `node_id` from SLURM_TASKS_PER_NODE ("2(x3),1": nodes 0-2 run 2, node 3 runs
/// 1). Throws ConfigError for a malformed value or a node beyond it.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id);

}  // namespace gpurun

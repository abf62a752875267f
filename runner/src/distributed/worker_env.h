// Who this process is in a distributed run, and what the launcher tells its workers.
//
// The worker contract is torchrun's (docs/architecture.md, "Worker environment"): RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GPURUN_RESTART_COUNT. A scheduler's
// variables (Slurm's: launch/slurm.h) are turned into these by the launcher before they get here.
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

/// The value of `key`; nullptr when it is unset or empty.
const std::string* env_value(const Environment& env, const std::string& key);

/// `text` as an integer. Throws ConfigError naming `name` for anything else.
int env_to_int(const std::string& text, const std::string& name);

/// `key`'s value as an integer. Throws ConfigError naming `key` (and `context`, why it is needed)
/// when it is unset or not a number.
int required_env_int(const Environment& env, const std::string& key, const std::string& context);

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

/// Command-line values (and a scheduler's, launch/slurm.h); an unset field (nullopt) is filled
/// from MASTER_ADDR / MASTER_PORT or the defaults.
struct LaunchFlags {
  std::optional<int> nproc_per_node, nnodes, node_rank, master_port;
  std::optional<std::string> master_addr;
};

/// Resolves the launch: flags first, then MASTER_ADDR/MASTER_PORT, then the defaults. Throws
/// ConfigError for
/// values out of range (node_rank >= nnodes, port outside 1..65535, nproc < 1).
LaunchSpec resolve_launch(const LaunchFlags& flags, const Environment& env);

/// A TCP port on this host that is free now (the kernel's pick for port 0). A single-node job
/// without --master-port or MASTER_PORT uses one, so that two jobs on one machine (two users
/// of a lab box, parallel tests) never collide on 29500. Throws IoError when no socket opens.
int find_free_port();

/// True when --master-port (or the scheduler, through the flags) or MASTER_PORT fixes the port.
bool master_port_given(const LaunchFlags& flags, const Environment& env);

/// The variables of worker `local_rank` (0 .. nproc_per_node-1) of `spec`'s node.
Environment worker_variables(const LaunchSpec& spec, int local_rank);

}  // namespace gpurun

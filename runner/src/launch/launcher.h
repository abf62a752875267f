// The worker-or-launcher decision of `gpurun run`: this process is one worker of a
// distributed job (WORLD_SIZE set by our launcher, torchrun or Slurm), the launcher of this
// node's workers (several ranks, or restarts asked for), or a single training process.
#pragma once

#include <string>
#include <vector>

#include "distributed/worker_env.h"
#include "gpurun/config.h"
#include "train/trainer.h"

namespace gpurun {

class Registry;

/// What the command line says about launching, beside the run itself.
struct LaunchRequest {
  int max_restarts = 0;                  ///< restarts after a failure (supervisor.h)
  double hang_timeout = 0;               ///< seconds without a step before kill + restart; 0: off
  LaunchFlags flags;                     ///< --nproc-per-node, --nnodes, ... as given
  std::string slurm_signal;              ///< --slurm-signal, as given (launch/slurm.h)
  std::vector<std::string> worker_argv;  ///< a worker's command line (launcher flags removed)
};

/// Trains `config` in this process, or launches and supervises the workers that do, and
/// returns the exit code (docs/architecture.md's codes). `run.dist` is filled in from the
/// environment (torchrun's variables, or Slurm's with several tasks per node: launch/slurm.h),
/// and `run.job` from Slurm's job. Throws ConfigError for a bad --slurm-signal, and what train()
/// and supervise() throw.
int launch_or_train(const RunConfig& config, RunOptions run, const LaunchRequest& request,
                    const Registry& registry);

}  // namespace gpurun

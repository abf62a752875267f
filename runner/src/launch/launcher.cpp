#include "launch/launcher.h"

#include <unistd.h>

#include <optional>

#include <spdlog/spdlog.h>

#include "config/rules.h"
#include "gpurun/errors.h"
#include "launch/notice_watcher.h"
#include "launch/supervisor.h"
#include "report/reporter.h"

namespace gpurun {

int launch_or_train(const RunConfig& config, RunOptions run, const LaunchRequest& request,
                    const Registry& registry) {
  Environment env = current_environment();
  if (slurm_runs_workers(env))
    for (const auto& [key, value] : worker_env_from_slurm(env)) env[key] = value;
  run.dist = worker_env(env);
  const std::string run_dir = run_dir_or_default(run);
  if (!run.dist) {
    LaunchSpec spec = resolve_launch(request.flags, env);
    const int world = spec.nnodes * spec.nproc_per_node;
    // Before any rank starts, joins the rendezvous and fails the same way (a resume at another
    // world size is where this meets users).
    if (const std::string problem = detail::batch_split_problem(config, world); !problem.empty())
      throw ConfigError(problem);
    if (world > 1 || request.max_restarts > 0 || request.hang_timeout > 0) {
      SupervisorOptions s;
      // The workers re-read the config; an error in it surfaced before, unretried.
      s.argv = request.worker_argv;
      s.max_restarts = request.max_restarts;
      s.hang_timeout = request.hang_timeout;
      const int first_rank = spec.node_rank * spec.nproc_per_node;
      s.progress_file = heartbeat_path(run_dir, first_rank);
      if (isatty(STDERR_FILENO)) s.env["GPURUN_STDERR_TTY"] = "1";
      if (world > 1) {
        if (spec.nnodes == 1 && !master_port_given(request.flags, env))
          spec.master_port = find_free_port();
        spdlog::info("launching ranks {}..{} of {} on node {} of {}; rendezvous at {}:{}",
                     first_rank, first_rank + spec.nproc_per_node - 1, world, spec.node_rank,
                     spec.nnodes, spec.master_addr, spec.master_port);
        for (int i = 0; i < spec.nproc_per_node; ++i)
          s.workers.push_back({worker_variables(spec, i), "rank " + std::to_string(first_rank + i),
                               heartbeat_path(run_dir, first_rank + i)});
      }
      return supervise(s);
    }
  } else if (request.flags.nproc_per_node || request.flags.nnodes) {
    spdlog::warn(
        "WORLD_SIZE is set, so this process is one worker (rank {} of {}); "
        "--nproc-per-node and --nnodes are ignored",
        run.dist->rank, run.dist->world_size);
  }
  if (!run.dist || run.dist->rank == 0) spdlog::info("{}", format_resolved(config));
  // The notices of this machine, watched by one process on it: a notice on any machine stops
  // every rank, as a signal to one rank does (the ranks agree on a stop at each step).
  std::optional<NoticeWatcher> watcher;
  if (!run.dist || run.dist->local_rank == 0) watcher.emplace(config.preemption, env);
  train(config, run, registry);
  return kExitOk;
}

}  // namespace gpurun

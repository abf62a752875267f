#include "launch/launcher.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "config/rules.h"
#include "gpurun/errors.h"
#include "launch/notice_watcher.h"
#include "launch/slurm.h"
#include "launch/supervisor.h"
#include "launch/worker_process.h"
#include "notify/notifier.h"
#include "report/reporter.h"
#include "util/clock.h"
#include "util/error_report.h"
#include "util/fs.h"
#include "util/signals.h"

namespace gpurun {
namespace {

// How long a question to slurmctld may take at the start (it answers in milliseconds; a
// controller that does not is not worth holding training for).
constexpr double kControllerTimeoutSeconds = 5;

// The Slurm job this process runs in, for the events and the start's check, and its warning
// signal (--slurm-signal, else the batch script's #SBATCH --signal, asked of the controller by
// the process that trains rank 0 or launches), which becomes a stop signal.
SchedulerJob slurm_context(const Environment& env, const std::string& flag, bool ask) {
  std::optional<SlurmSignal> signal;
  std::string signal_text = flag;
  if (!flag.empty()) {
    try {
      signal = parse_slurm_signal(flag);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("--slurm-signal: ") + e.what());
    }
  }
  SchedulerJob job;
  if (const std::optional<SlurmJob> slurm = slurm_job(env)) {
    job.scheduler = "slurm";
    job.job_id = slurm->job_id;
    job.restart_count = slurm->restart_count;
    if (ask) {
      const SlurmJobState state = query_slurm_job(job.job_id, kControllerTimeoutSeconds);
      if (state.seconds_left) job.time_limit_unix = unix_seconds() + *state.seconds_left;
      if (!signal && state.signal) {
        try {
          signal = parse_slurm_signal(*state.signal);
          signal_text = *state.signal;
        } catch (const ConfigError& e) {
          spdlog::warn("the job's #SBATCH --signal is not understood ({}); pass --slurm-signal",
                       e.what());
        }
      }
    }
  }
  if (signal) {
    try {
      add_stop_signal(signal->number);
      job.signal = signal_name(signal->number);
      job.signal_lead_seconds = signal->lead_seconds;
    } catch (const std::invalid_argument& e) {
      const std::string problem =
          "the Slurm signal \"" + signal_text + "\" cannot stop a run (" + e.what() + ")";
      if (!flag.empty()) throw ConfigError("--slurm-signal: " + problem);
      spdlog::warn("{}: it ends the run without a save", problem);
    }
  }
  return job;
}

// Set by our supervisor in its workers' environment: it sends `failed` and runs
// cost.stop_command, since only it knows whether a restart follows.
constexpr const char* kSupervisedVariable = "GPURUN_SUPERVISED";

// What the run's status.json says, for a message from a process that does not train (the
// supervisor) or no longer does (a failure): {} when there is none.
nlohmann::json read_status(const std::string& run_dir) {
  try {
    const std::string path = run_dir + "/status.json";
    if (!fs::exists(path)) return nlohmann::json::object();
    nlohmann::json status = nlohmann::json::parse(fs::read_file(path), nullptr, false);
    return status.is_object() ? status : nlohmann::json::object();
  } catch (const std::exception&) {
    return nlohmann::json::object();
  }
}

// The run's name in messages: its checkpoint directory's last part ("exp1").
std::string run_name(const RunOptions& run) {
  std::string dir = run.ckpt_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string name = std::filesystem::path(dir).filename().string();
  return name.empty() ? dir : name;
}

// cost.stop_command once the run has finished (0) or stopped at its budget (4): the final
// checkpoint is safe in --ckpt by then (the trainer's finish() waited for the network tier).
// Its messages go out first, since the command may power the machine off.
void after_the_run(const RunConfig& config, int code, Notifier* notifier) {
  if (notifier) notifier->flush(Notifier::kExitWaitSeconds);
  if (config.cost.stop_command.empty() || (code != kExitOk && code != kExitBudget)) return;
  if (const char* queue = std::getenv(kQueueVariable)) {
    spdlog::info(
        "cost.stop_command is not run: this run is one of the queue in {}, which goes on; "
        "give the queue file a stop_command to run when the queue ends",
        queue);
    return;
  }
  spdlog::info("cost.stop_command (the run {}): {}",
               code == kExitOk ? "finished" : "stopped at its budget", config.cost.stop_command);
  ::setenv("GPURUN_EXIT_CODE", std::to_string(code).c_str(), 1);
  const int status = std::system(config.cost.stop_command.c_str());
  if (status != 0) spdlog::warn("cost.stop_command exited with status {}", status);
}

}  // namespace

int launch_or_train(const RunConfig& config, RunOptions run, const LaunchRequest& request,
                    const Registry& registry) {
  Environment env = current_environment();
  if (slurm_runs_workers(env))
    for (const auto& [key, value] : worker_env_from_slurm(env)) env[key] = value;
  run.dist = worker_env(env);
  run.job = slurm_context(env, request.slurm_signal, !run.dist || run.dist->rank == 0);
  const std::string run_dir = run_dir_or_default(run);
  if (!run.dist) {
    const LaunchFlags flags = with_slurm_launch(request.flags, env);
    LaunchSpec spec = resolve_launch(flags, env);
    const int world = spec.nnodes * spec.nproc_per_node;
    // Before any rank starts, joins the rendezvous and fails the same way (a resume at another
    // world size is where this meets users).
    if (const std::string problem = detail::batch_split_problem(config, world); !problem.empty())
      throw ConfigError(problem);
    // A `failed` message must also come when the process that trains is killed outright (the
    // OOM killer's SIGKILL), which only a parent sees: with one wanted, a supervisor runs it.
    const bool report_deaths =
        env.count(kSupervisedVariable) == 0 && sends(config.notify, "failed");
    if (world > 1 || request.max_restarts > 0 || request.hang_timeout > 0 || report_deaths) {
      SupervisorOptions s;
      s.env[kSupervisedVariable] = "1";
      // One machine speaks for the run: the first node's launcher.
      std::unique_ptr<Notifier> notifier;
      if (spec.node_rank == 0)
        notifier = std::make_unique<Notifier>(config.notify, run_dir, run_name(run));
      if (notifier)
        s.notify = [&](const std::string& event, const nlohmann::json& details) {
          notifier->send(event, read_status(run_dir), details);
        };
      // The workers re-read the config; an error in it surfaced before, unretried.
      s.argv = request.worker_argv;
      s.max_restarts = request.max_restarts;
      s.hang_timeout = request.hang_timeout;
      const int first_rank = spec.node_rank * spec.nproc_per_node;
      s.progress_file = heartbeat_path(run_dir, first_rank);
      if (isatty(STDERR_FILENO)) s.env["GPURUN_STDERR_TTY"] = "1";
      if (world > 1) {
        if (spec.nnodes == 1 && !master_port_given(flags, env)) spec.master_port = find_free_port();
        spdlog::info("launching ranks {}..{} of {} on node {} of {}; rendezvous at {}:{}",
                     first_rank, first_rank + spec.nproc_per_node - 1, world, spec.node_rank,
                     spec.nnodes, spec.master_addr, spec.master_port);
        for (int i = 0; i < spec.nproc_per_node; ++i)
          s.workers.push_back({worker_variables(spec, i), "rank " + std::to_string(first_rank + i),
                               heartbeat_path(run_dir, first_rank + i)});
      }
      const int code = supervise(s);
      after_the_run(config, code, notifier.get());
      return code;
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
  const bool supervised = env.count(kSupervisedVariable) > 0;
  std::unique_ptr<Notifier> notifier;
  if (!run.dist || run.dist->rank == 0)
    notifier = std::make_unique<Notifier>(config.notify, run_dir, run_name(run));
  run.notifier = notifier.get();
  int code = kExitOk;
  try {
    train(config, run, registry);
  } catch (const std::exception& e) {
    code = exit_code_for(e);
    // Under our supervisor the failure is its to report, once it knows no restart follows.
    // A process that found the directory held by another run never was the run.
    const bool lease_held = dynamic_cast<const LeaseHeld*>(&e) != nullptr;
    if (notifier && !supervised && code != kExitSignal && code != kExitBudget && !lease_held)
      notifier->send("failed", read_status(run_dir), {{"error", e.what()}, {"exit_code", code}});
    if (notifier) notifier->flush(Notifier::kExitWaitSeconds);
    if (!supervised && (!run.dist || run.dist->local_rank == 0))
      after_the_run(config, code, nullptr);
    throw;
  }
  if (!supervised && (!run.dist || run.dist->local_rank == 0))
    after_the_run(config, code, notifier.get());
  return code;
}

}  // namespace gpurun

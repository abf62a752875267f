#include "train/scheduler_job.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace gpurun {
namespace {

// sbatch's spelling of a signal: "SIGUSR1" -> "USR1", "signal 40" -> "40".
std::string sbatch_name(const std::string& name) {
  if (name.rfind("SIG", 0) == 0) return name.substr(3);
  const size_t space = name.rfind(' ');
  return space == std::string::npos ? name : name.substr(space + 1);
}

}  // namespace

nlohmann::json job_json(const SchedulerJob& job) {
  if (job.scheduler.empty()) return nullptr;
  return {
      {"scheduler", job.scheduler}, {"job_id", job.job_id}, {"restart_count", job.restart_count}};
}

JobLines describe_job(const SchedulerJob& job, const StopCost& cost, double now_unix) {
  JobLines out;
  if (job.scheduler.empty()) return out;
  const bool limited = job.time_limit_unix > 0;
  const double left = limited ? std::max(0.0, job.time_limit_unix - now_unix) : 0;
  out.info = fmt::format(
      "{} job {}{}{}{}", job.scheduler, job.job_id,
      job.restart_count > 0 ? fmt::format(" (requeued {} time{})", job.restart_count,
                                          job.restart_count == 1 ? "" : "s")
                            : "",
      limited ? fmt::format(": {:.0f} s to its time limit", left) : "",
      job.signal.empty() ? ""
                         : fmt::format("; {} {:.0f} s before {}", job.signal,
                                       job.signal_lead_seconds, limited ? "it" : "its time limit"));
  const std::string need = fmt::format(
      "a step and a save take about {:.1f} s here ({:.1f} s the step, {:.1f} s the save{})",
      cost.total(), cost.step_seconds, cost.save_seconds,
      cost.save_measured ? ", as last measured" : ", assumed: no save measured yet");
  if (!job.signal.empty() && job.signal_lead_seconds < cost.total())
    out.warnings.push_back(fmt::format(
        "the job's {} comes {:.0f} s before its time limit, but {}: the limit may kill the run "
        "before its checkpoint is complete; ask for the signal earlier (sbatch "
        "--signal=B:{}@{:.0f})",
        job.signal, job.signal_lead_seconds, need, sbatch_name(job.signal),
        std::max(120.0, 2 * cost.total())));
  if (limited && left < cost.total())
    out.warnings.push_back(fmt::format(
        "the job has {:.0f} s left before its time limit, but {}: this start may end without a "
        "new checkpoint",
        left, need));
  if (limited && job.signal.empty())
    out.warnings.push_back(
        "the job has a time limit but no warning signal that gpurun knows of: at the limit "
        "Slurm sends SIGTERM and SIGKILL KillWait seconds later (30 by default), so a save "
        "that takes longer is lost; add `#SBATCH --signal=B:USR1@120` (examples/slurm/"
        "train.sbatch), or name a --signal given on sbatch's command line with --slurm-signal");
  return out;
}

}  // namespace gpurun

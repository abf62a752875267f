// What the trainer does with the scheduler's job it runs in (RunOptions::job, filled in by
// launch/slurm.h under Slurm): the job in the events, and the check at the start that the job's
// time limit and its warning signal leave time for a step and a save.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "train/trainer.h"

namespace gpurun {

/// {"scheduler", "job_id", "restart_count"} for the plan, resume and signal events and
/// status.json; null for no job.
nlohmann::json job_json(const SchedulerJob& job);

/// What a stop at the warning signal needs, in seconds.
struct StopCost {
  double step_seconds = 0;  ///< one optimizer step (the plan's), which a stop lets finish
  double save_seconds = 0;  ///< a save's build and write (the last measured, else assumed)
  bool save_measured = false;
  double total() const { return step_seconds + save_seconds; }
};

/// What describe_job() says: an info line and warnings.
struct JobLines {
  std::string info;
  std::vector<std::string> warnings;
};

/// The lines to log at the start: one that describes the job (its id, requeues, time left and
/// signal), then a warning for each way its time limit may end it before it has saved:
/// - the signal comes fewer seconds before the limit than `cost` takes;
/// - the time left now is shorter than `cost`;
/// - there is a time limit but no signal is known (Slurm then sends SIGTERM at the limit and
///   SIGKILL KillWait seconds later, 30 by default).
/// `now_unix`: the current time (Unix seconds). Empty for no job. Throws nothing but bad_alloc.
JobLines describe_job(const SchedulerJob& job, const StopCost& cost, double now_unix);

}  // namespace gpurun

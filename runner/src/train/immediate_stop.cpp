#include "train/immediate_stop.h"

#include <mutex>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpointer.h"
#include "gpurun/errors.h"
#include "report/reporter.h"

namespace gpurun {

void record_immediate_stop(int sig, int64_t step, int64_t epoch, int rank,
                           Checkpointer& checkpointer, Reporter& reporter,
                           const std::string& ckpt_dir, const nlohmann::json& attempt) {
  std::string newest;
  int64_t newest_step = -1;
  // Held until the process exits: a write in flight cannot complete after the directory is
  // read, so what the message says is saved stays true.
  std::unique_lock<std::timed_mutex> no_commits;
  if (rank == 0) {
    no_commits = checkpointer.hold_commits(2.0);
    try {
      if (const std::optional<CheckpointInfo> info = checkpointer.newest_saved()) {
        newest = info->path;
        newest_step = info->global_step;
      }
    } catch (const std::exception&) {
      newest.clear();  // the directory cannot be read: say so rather than guess
    }
  }
  std::string saved;
  if (rank != 0)
    saved = "rank 0 names the newest complete checkpoint";
  else if (newest.empty() && !no_commits.owns_lock())
    saved =
        "a checkpoint was being completed: `gpurun ckpt list " + ckpt_dir + "` shows whether it is";
  else if (newest.empty())
    saved = "nothing of this run is saved: there is no complete checkpoint in " + ckpt_dir;
  else if (newest_step == step)
    saved = "global step " + std::to_string(step) + " is saved in " + newest;
  else
    saved = "the newest complete checkpoint is " + newest + " (global step " +
            std::to_string(newest_step) + ")";
  const std::string message = "second interrupt at global step " + std::to_string(step) +
                              ": stopped at once, without waiting for a checkpoint; " + saved +
                              "; run again with --resume";
  reporter.end_progress();
  spdlog::warn("{}", message);
  reporter.event("signal", {{"signal", sig}, {"global_step", step}, {"immediate", true}});
  nlohmann::json status = {
      {"state", "stopped"}, {"epoch", epoch}, {"global_step", step}, {"error", message}};
  if (!newest.empty()) status["last_checkpoint"] = newest;
  reporter.end_run(
      {{"exit_code", kExitSignal}, {"error", message}, {"global_step", step}, {"attempt", attempt}},
      status);
}

}  // namespace gpurun

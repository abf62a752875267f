#include "cli/status_command.h"
#include "util/units.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpointer.h"
#include "checkpoint/storage/checkpoint_storage.h"
#include "checkpoint/storage/store.h"
#include "gpurun/errors.h"
#include "notify/notice_message.h"
#include "queue/queue_state.h"
#include "queue/queue_summary.h"
#include "report/metrics_tail.h"
#include "util/clock.h"
#include "util/fs.h"

namespace gpurun {

int status_command(const std::string& dir, bool json, std::ostream& out) {
  // An s3:// root's status.json is on the machine that runs it (Checkpointer::default_run_dir).
  const std::string run_dir = is_object_root(dir) ? Checkpointer::default_run_dir(dir) : dir;
  if (run_dir != dir && !fs::exists(run_dir + "/status.json"))
    throw ConfigError("no run of " + dir + " on this machine: its status.json is in " + run_dir +
                      " (or its --run-dir) on the machine that runs it; `gpurun ckpt list " + dir +
                      "` shows its checkpoints");
  // A `gpurun queue` directory: its runs, each with its state (queue/queue_summary.h).
  if (fs::exists(run_dir + "/queue.json")) return queue_status(run_dir, json, out);
  std::string text;
  try {
    text = fs::read_file(run_dir + "/status.json");
  } catch (const IoError& e) {
    bool checkpoints = false;
    try {
      checkpoints = CheckpointView(run_dir).has_checkpoints();
    } catch (const IoError&) {
    }
    // A checkpoint directory whose run wrote metrics and status elsewhere (--run-dir).
    if (checkpoints)
      throw ConfigError(run_dir +
                        " holds checkpoints but no status.json: its run was started "
                        "with --run-dir, which is where status.json is; give that directory "
                        "(gpurun ckpt list " +
                        run_dir + " shows the checkpoints)");
    throw ConfigError("no run in " + run_dir + ": " + e.what());
  }
  nlohmann::json s = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (s.is_discarded()) throw Error(run_dir + "/status.json is not valid JSON");
  const double age = unix_seconds() - s.value("updated", 0.0);
  s["seconds_since_update"] = age;
  // A run killed outright (SIGKILL, OOM killer, power) never wrote its last state.
  if (s.value("state", "") == "running" && s.value("host", "") == host_name() &&
      s.contains("pid") && kill(static_cast<pid_t>(s["pid"].get<int64_t>()), 0) != 0 &&
      errno == ESRCH)
    s["state"] = "dead";
  // status.json is written at most every 10 s, and a run killed outright never writes its last
  // one: metrics.jsonl's newest step event may be further on. Its epoch, step and loss win then.
  if (const std::string state = s.value("state", ""); state == "running" || state == "dead") {
    const std::optional<nlohmann::json> step =
        last_event_in_tail(run_dir + "/metrics.jsonl", "step");
    const auto step_of = [](const nlohmann::json& j) {
      return j.contains("global_step") && j["global_step"].is_number_integer()
                 ? j["global_step"].get<int64_t>()
                 : int64_t{-1};
    };
    if (step && step_of(*step) > step_of(s)) {
      for (const char* key : {"epoch", "global_step", "loss", "samples_per_second"})
        if (step->contains(key)) s[key] = (*step)[key];
      s["step_from"] = "metrics.jsonl";  // status.json's own step was older
    }
  }
  // The checkpoints by their manifests and sizes, quick enough for every status; the checksums
  // are `gpurun ckpt verify`'s.
  nlohmann::json checkpoints = {{"checked", "sizes"}};
  std::string checkpoint_line, problem;
  try {
    const RunCheckpoints checked = check_run_checkpoints(run_dir, /*verify=*/false);
    const CheckpointInfo* newest = checked.summary.newest();
    checkpoints["dir"] = checked.dir;
    checkpoints["newest"] = newest ? nlohmann::json(newest->name) : nlohmann::json();
    checkpoints["newest_complete"] = checked.summary.newest_complete
                                         ? nlohmann::json(checked.summary.newest_complete->name)
                                         : nlohmann::json();
    checkpoints["ok"] = checked.problem.empty();
    checkpoints["problem"] = checked.problem;
    checkpoint_line = checked.summary.describe();
    problem = checked.problem;
  } catch (const IoError& e) {
    checkpoint_line = problem = std::string("cannot be read: ") + e.what();
    checkpoints["ok"] = false;
    checkpoints["problem"] = problem;
  }
  s["checkpoints"] = checkpoints;
  if (json) {
    out << s.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return kExitOk;
  }
  auto get = [&](const char* key) {
    if (!s.contains(key)) return std::string("-");
    if (!s[key].is_number_float()) return s[key].dump();
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", s[key].get<double>());
    return std::string(buf);
  };
  // status.json counts epochs from 0 in every state, as metrics.jsonl does; people count from
  // 1, as the progress line does. (gpurun before 0-based finished runs wrote the count: the
  // clamp keeps their status right.)
  std::string epoch = get("epoch");
  if (s.contains("epoch") && s["epoch"].is_number_integer()) {
    int64_t e = s["epoch"].get<int64_t>() + 1;
    if (s.contains("epochs") && s["epochs"].is_number_integer())
      e = std::min(e, s["epochs"].get<int64_t>());
    epoch = std::to_string(e);
  }
  const bool live = s.value("state", "") == "running";
  out << "run dir         " << run_dir << "\n"
      << "state           " << s.value("state", "?")
      << (s.value("state", "") == "dead" ? " (its process is gone: run again with --resume)" : "")
      << " (updated " << format_duration(age) << " ago, pid " << get("pid") << " on "
      << s.value("host", "?") << ")\n"
      << "epoch           " << epoch << " of " << get("epochs") << "\n"
      << "step            " << get("global_step") << " of " << get("total_steps")
      << (s.contains("step_from") ? " (metrics.jsonl's last step event; status.json's is older)"
                                  : "")
      << "\n"
      << "loss            " << get("loss") << "\n"
      << "samples/s       " << get("samples_per_second") << "\n"
      << "ETA             " << (live ? format_duration(s.value("eta_seconds", -1.0)) : "-") << "\n"
      << "last checkpoint " << s.value("last_checkpoint", std::string("none")) << "\n";
  // With checkpoint.local_dir, last_checkpoint is in the local tier; the copy may lag behind.
  if (s.contains("local_tier"))
    out << "  in --ckpt     " << s.value("last_network_checkpoint", std::string("none yet"))
        << "\n";
  if (s.contains("eval_loss"))
    out << "eval            loss " << get("eval_loss") << ", accuracy " << get("eval_accuracy")
        << "\n";
  if (s.contains("cost")) out << "cost            " << describe_cost(s["cost"]) << "\n";
  out << "restarts        " << get("restarts") << "\n"
      << "checkpoints     " << checkpoint_line << "\n";
  if (!problem.empty() && problem != checkpoint_line) out << "  NOT INTACT    " << problem << "\n";
  return kExitOk;
}

}  // namespace gpurun

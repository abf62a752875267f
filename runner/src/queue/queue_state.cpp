#include "queue/queue_state.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <sstream>

#include "checkpoint/storage/store.h"
#include "gpurun/errors.h"
#include "util/clock.h"
#include "util/fs.h"

namespace gpurun {
namespace {

constexpr int kFormatVersion = 1;

RunState state_from_name(const std::string& name) {
  for (RunState s : {RunState::kPending, RunState::kRunning, RunState::kInterrupted,
                     RunState::kFinished, RunState::kFailed})
    if (name == run_state_name(s)) return s;
  throw Error("queue.json: unknown run state \"" + name + "\"");
}

}  // namespace

const char* run_state_name(RunState state) noexcept {
  switch (state) {
    case RunState::kPending:
      return "pending";
    case RunState::kRunning:
      return "running";
    case RunState::kInterrupted:
      return "interrupted";
    case RunState::kFinished:
      return "finished";
    case RunState::kFailed:
      return "failed";
  }
  return "?";
}

nlohmann::json to_json(const QueueState& state) {
  nlohmann::json runs = nlohmann::json::array();
  for (const RunRecord& r : state.runs) {
    runs.push_back({{"name", r.name},
                    {"seed", r.seed ? nlohmann::json(*r.seed) : nlohmann::json()},
                    {"config", r.config},
                    {"set", r.sets},
                    {"queue_set", r.queue_sets},
                    {"state", run_state_name(r.state)},
                    {"exit_code", r.exit_code},
                    {"signal", r.signal},
                    {"restarts", r.restarts},
                    {"attempts", r.attempts},
                    {"started", r.started},
                    {"ended", r.ended},
                    {"wall_seconds", r.wall_seconds},
                    {"attempt_started", r.attempt_started},
                    {"pid", r.pid},
                    {"device", r.device},
                    {"error", r.error}});
  }
  return {{"format_version", kFormatVersion},
          {"queue_file", state.queue_file},
          {"host", state.host},
          {"pid", state.pid},
          {"parallel", state.parallel},
          {"updated", state.updated},
          {"stopping", state.stopping},
          {"runs", runs}};
}

QueueState queue_state_from_json(const nlohmann::json& j) {
  try {
    if (!j.is_object() || j.value("format_version", 0) != kFormatVersion)
      throw Error("queue.json: not a queue state of format " + std::to_string(kFormatVersion));
    QueueState s;
    s.queue_file = j.value("queue_file", "");
    s.host = j.value("host", "");
    s.pid = j.value("pid", int64_t{0});
    s.parallel = j.value("parallel", 1);
    s.updated = j.value("updated", 0.0);
    s.stopping = j.value("stopping", false);
    for (const nlohmann::json& r : j.at("runs")) {
      RunRecord rec;
      rec.name = r.at("name").get<std::string>();
      if (r.contains("seed") && r["seed"].is_number_integer()) rec.seed = r["seed"].get<int64_t>();
      rec.config = r.value("config", "");
      rec.sets = r.value("set", std::vector<std::string>{});
      rec.queue_sets = r.value("queue_set", std::vector<std::string>{});
      rec.state = state_from_name(r.value("state", "pending"));
      rec.exit_code = r.value("exit_code", -1);
      rec.signal = r.value("signal", 0);
      rec.restarts = r.value("restarts", 0);
      rec.attempts = r.value("attempts", 0);
      rec.started = r.value("started", 0.0);
      rec.ended = r.value("ended", 0.0);
      rec.wall_seconds = r.value("wall_seconds", 0.0);
      rec.attempt_started = r.value("attempt_started", 0.0);
      rec.pid = r.value("pid", int64_t{0});
      rec.device = r.value("device", "");
      rec.error = r.value("error", "");
      s.runs.push_back(std::move(rec));
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("queue.json: ") + e.what());
  }
}

std::optional<QueueState> read_queue_state(const std::string& dir) {
  const std::string path = dir + "/queue.json";
  std::string text;
  try {
    text = fs::with_retries([&] { return fs::read_file(path); });
  } catch (const IoError& e) {
    if (e.error_number() == ENOENT) return std::nullopt;
    throw;
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(path + " is not valid JSON");
  return queue_state_from_json(j);
}

void write_queue_state(const std::string& dir, QueueState& state) {
  state.updated = unix_seconds();
  const std::string text = to_json(state).dump(2) + "\n";
  fs::with_retries([&] { fs::replace_file(dir + "/queue.json", text); });
}

std::string run_dir_of(const std::string& dir, const std::string& name) {
  return dir + "/runs/" + name;
}

double attempt_end_of(const std::string& dir, const RunRecord& r) {
  const std::string run_dir = run_dir_of(dir, r.name);
  double last = r.attempt_started;
  for (const char* name :
       {"stderr.log", "stdout.log", "metrics.jsonl", "status.json", "heartbeat"}) {
    struct stat st {};
    if (::stat((run_dir + "/" + name).c_str(), &st) != 0) continue;
    last = std::max(last, static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9);
  }
  return std::min(last, std::max(r.attempt_started, unix_seconds()));
}

double run_wall_seconds(const std::string& dir, const RunRecord& r, bool queue_live) {
  if (r.state != RunState::kRunning || r.attempt_started <= 0) return r.wall_seconds;
  const double end = queue_live ? unix_seconds() : attempt_end_of(dir, r);
  return r.wall_seconds + std::max(0.0, end - r.attempt_started);
}

RunMetrics read_run_metrics(const std::string& run_dir) {
  RunMetrics out;
  std::string text;
  try {
    text = fs::read_file(run_dir + "/metrics.jsonl");
  } catch (const std::exception&) {
    return out;
  }
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    // Only the lines that matter are parsed: most are `step` events.
    const bool done = line.find("\"done\"") != std::string::npos;
    const bool epoch = line.find("\"epoch\":") != std::string::npos &&
                       line.find("\"event\":\"epoch\"") != std::string::npos;
    const bool checkpoint = line.find("\"event\":\"checkpoint\"") != std::string::npos;
    if (!done && !epoch && !checkpoint) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    const std::string event = j.value("event", "");
    if (event == "done" && j.contains("exit_code") && j["exit_code"].is_number_integer())
      out.done_exit_code = j["exit_code"].get<int>();
    if (event == "epoch") out.last_epoch = j;
    if (event == "checkpoint" && j.contains("global_step") && j["global_step"].is_number_integer())
      out.last_checkpoint_step = j["global_step"].get<int64_t>();
  }
  return out;
}

std::string checkpoint_dir_of(const std::string& run_dir) {
  std::error_code ec;
  if (std::filesystem::exists(run_dir + "/LATEST", ec)) return run_dir;
  try {
    const nlohmann::json s =
        nlohmann::json::parse(fs::read_file(run_dir + "/status.json"), nullptr, false);
    for (const char* key : {"last_network_checkpoint", "last_checkpoint"}) {
      if (!s.is_object() || !s.contains(key) || !s[key].is_string()) continue;
      const std::filesystem::path folder = s[key].get<std::string>();
      if (folder.has_parent_path()) return folder.parent_path().string();
    }
  } catch (const std::exception&) {
    // No status.json (yet): the run directory is the checkpoint directory by default.
  }
  return run_dir;
}

RunCheckpoints check_run_checkpoints(const std::string& run_dir, bool verify) {
  RunCheckpoints out;
  out.dir = checkpoint_dir_of(run_dir);
  out.summary = CheckpointView(out.dir).summary(verify);
  // A finished run's final checkpoint is in --ckpt (a local tier's copy arrived before its exit
  // 0); while a run goes on, its newest state may be in the local tier alone.
  const RunMetrics metrics = read_run_metrics(run_dir);
  const int64_t saved = metrics.done_exit_code == 0 && metrics.last_checkpoint_step
                            ? *metrics.last_checkpoint_step
                            : -1;
  const CheckpointSummary& s = out.summary;
  if (!s.ok() && (s.newest() || s.lost() || saved >= 0)) {
    out.problem = s.newest() || s.lost() ? s.describe() : "no checkpoint in " + out.dir;
  } else if (saved >= 0 && s.newest_complete && s.newest_complete->global_step < saved) {
    out.problem = "its newest checkpoint, " + s.newest_complete->name + ", is older than the " +
                  "global step " + std::to_string(saved) + " it saved last";
  }
  return out;
}

}  // namespace gpurun

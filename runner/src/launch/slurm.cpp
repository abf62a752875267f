#include "launch/slurm.h"

#include <cctype>
#include <csignal>
#include <cstring>
#include <ctime>
#include <sstream>
#include <vector>

#include "gpurun/errors.h"
#include "launch/worker_process.h"

namespace gpurun {
namespace {

int slurm_nnodes(const Environment& env) {
  if (const std::string* v = env_value(env, "SLURM_JOB_NUM_NODES"))
    return env_to_int(*v, "SLURM_JOB_NUM_NODES");
  return required_env_int(env, "SLURM_NNODES", "Slurm step");
}

std::string slurm_master_addr(const Environment& env) {
  if (const std::string* v = env_value(env, "MASTER_ADDR")) return *v;
  const std::string* list = env_value(env, "SLURM_STEP_NODELIST");
  if (!list) list = env_value(env, "SLURM_JOB_NODELIST");
  if (!list) throw ConfigError("SLURM_JOB_NODELIST is not set: cannot tell rank 0's host");
  return first_slurm_host(*list);
}

int slurm_master_port(const Environment& env) {
  if (const std::string* v = env_value(env, "MASTER_PORT")) return env_to_int(*v, "MASTER_PORT");
  return 20000 + required_env_int(env, "SLURM_JOB_ID", "Slurm step") % 10000;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// "EndTime=2026-12-06T10:15:10" (the controller's local time, as scontrol prints it) as Unix
// seconds; nullopt for "Unknown" (no time limit) or anything else.
std::optional<double> end_time(const std::string& show_job) {
  const size_t at = show_job.find("EndTime=");
  if (at == std::string::npos) return std::nullopt;
  std::tm tm{};
  const char* end = strptime(show_job.c_str() + at + 8, "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end) return std::nullopt;
  tm.tm_isdst = -1;
  const std::time_t t = std::mktime(&tm);
  if (t == static_cast<std::time_t>(-1)) return std::nullopt;
  return static_cast<double>(t);
}

}  // namespace

bool in_slurm_step(const Environment& env) {
  return env_value(env, "SLURM_JOB_ID") && env_value(env, "SLURM_PROCID") &&
         env_value(env, "SLURM_NTASKS");
}

bool slurm_runs_workers(const Environment& env) {
  return in_slurm_step(env) && !env_value(env, "WORLD_SIZE") &&
         required_env_int(env, "SLURM_NTASKS", "Slurm step") > slurm_nnodes(env);
}

Environment worker_env_from_slurm(const Environment& env) {
  const std::string context = "Slurm step with several tasks per node";
  const int node = required_env_int(env, "SLURM_NODEID", context);
  int local_world = 0;
  if (const std::string* per_node = env_value(env, "SLURM_TASKS_PER_NODE"))
    local_world = slurm_tasks_on_node(*per_node, node);
  else
    local_world = required_env_int(env, "SLURM_NTASKS_PER_NODE", context);
  return {{"RANK", std::to_string(required_env_int(env, "SLURM_PROCID", context))},
          {"LOCAL_RANK", std::to_string(required_env_int(env, "SLURM_LOCALID", context))},
          {"WORLD_SIZE", std::to_string(required_env_int(env, "SLURM_NTASKS", context))},
          {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
          {"MASTER_ADDR", slurm_master_addr(env)},
          {"MASTER_PORT", std::to_string(slurm_master_port(env))}};
}

LaunchFlags with_slurm_launch(LaunchFlags flags, const Environment& env) {
  if (!in_slurm_step(env) || slurm_runs_workers(env)) return flags;
  if (!flags.nnodes) flags.nnodes = slurm_nnodes(env);
  if (!flags.node_rank) flags.node_rank = required_env_int(env, "SLURM_NODEID", "Slurm step");
  if (!flags.master_addr) flags.master_addr = slurm_master_addr(env);
  if (!flags.master_port) flags.master_port = slurm_master_port(env);
  return flags;
}

std::string first_slurm_host(const std::string& nodelist) {
  // Grammar (Slurm's hostlist): host ("," host)*, host = prefix ["[" range ("," range)* "]"]
  // suffix?, range = N or N-M with the digits' zero padding kept.
  const size_t comma = nodelist.find(',');
  const size_t bracket = nodelist.find('[');
  if (nodelist.empty() || nodelist[0] == ',' || nodelist[0] == '[')
    throw ConfigError("malformed Slurm host list \"" + nodelist + "\"");
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket))
    return nodelist.substr(0, comma);
  const size_t close = nodelist.find(']', bracket);
  if (close == std::string::npos)
    throw ConfigError("malformed Slurm host list \"" + nodelist + "\"");
  const std::string prefix = nodelist.substr(0, bracket);
  std::string first = nodelist.substr(bracket + 1, close - bracket - 1);
  first = first.substr(0, first.find_first_of(",-"));
  if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
    throw ConfigError("malformed Slurm host list \"" + nodelist + "\"");
  // A suffix after the bracket belongs to every host: "n[1-2]-ib" -> "n1-ib".
  size_t end = nodelist.find(',', close);
  const std::string suffix =
      nodelist.substr(close + 1, end == std::string::npos ? end : end - close - 1);
  return prefix + first + suffix;
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id) {
  // "2(x3),1": a count, optionally repeated for several nodes.
  int node = 0;
  size_t at = 0;
  const auto bad = [&] {
    return ConfigError("malformed SLURM_TASKS_PER_NODE \"" + tasks_per_node + "\"");
  };
  while (at < tasks_per_node.size()) {
    size_t end = tasks_per_node.find(',', at);
    if (end == std::string::npos) end = tasks_per_node.size();
    const std::string item = tasks_per_node.substr(at, end - at);
    const size_t paren = item.find("(x");
    if (item.empty() || !std::isdigit(static_cast<unsigned char>(item[0]))) throw bad();
    const int count = env_to_int(item.substr(0, paren), "SLURM_TASKS_PER_NODE");
    int repeat = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') throw bad();
      repeat = env_to_int(item.substr(paren + 2, item.size() - paren - 3), "SLURM_TASKS_PER_NODE");
    }
    if (node_id < node + repeat) return count;
    node += repeat;
    at = end + 1;
  }
  throw ConfigError("SLURM_TASKS_PER_NODE \"" + tasks_per_node + "\" has no node " +
                    std::to_string(node_id));
}

std::optional<SlurmJob> slurm_job(const Environment& env) {
  const std::string* id = env_value(env, "SLURM_JOB_ID");
  if (!id) return std::nullopt;
  SlurmJob job{*id, 0};
  if (const std::string* n = env_value(env, "SLURM_RESTART_COUNT"))
    job.restart_count = env_to_int(*n, "SLURM_RESTART_COUNT");
  return job;
}

SlurmSignal parse_slurm_signal(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return ConfigError("bad Slurm signal \"" + text + "\" (" + why +
                       "; the form is [{R|B}:]SIG[@TIME], e.g. B:USR1@120)");
  };
  SlurmSignal s;
  std::string rest = text;
  const size_t colon = rest.find(':');
  if (colon != std::string::npos) {
    const std::string flags = rest.substr(0, colon);
    if (flags.empty() || flags.find_first_not_of("RB") != std::string::npos)
      throw bad("the part before ':' may hold only R and B");
    s.batch_shell = flags.find('B') != std::string::npos;
    rest = rest.substr(colon + 1);
  }
  const size_t at = rest.find('@');
  std::string name = rest.substr(0, at);
  if (at != std::string::npos) {
    const std::string time = rest.substr(at + 1);
    if (time.empty() || time.find_first_not_of("0123456789") != std::string::npos ||
        time.size() > 5 || std::stoi(time) > 65535)
      throw bad("TIME must be seconds, 0..65535");
    s.lead_seconds = std::stoi(time);
  }
  if (name.empty()) throw bad("no signal");
  if (name.find_first_not_of("0123456789") == std::string::npos) {
    if (name.size() > 2 || std::stoi(name) < 1 || std::stoi(name) > 64)
      throw bad("a signal number is 1..64");
    s.number = std::stoi(name);
    return s;
  }
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  for (int n = 1; n < NSIG; ++n)
    if (const char* abbrev = sigabbrev_np(n); abbrev && name == abbrev) {
      s.number = n;
      return s;
    }
  throw bad("unknown signal name");
}

std::optional<std::string> sbatch_signal_line(const std::string& script) {
  std::istringstream in(script);
  std::string line;
  std::optional<std::string> found;
  bool first = true;
  while (std::getline(in, line)) {
    const std::string t = trim(line);
    if (first && t.rfind("#!", 0) == 0) {
      first = false;
      continue;
    }
    first = false;
    if (t.empty()) continue;
    // sbatch stops reading #SBATCH lines at the first command.
    if (t[0] != '#') break;
    if (t.rfind("#SBATCH", 0) != 0) continue;
    std::istringstream words(t.substr(7));
    std::string word;
    while (words >> word) {
      if (word.rfind("--signal=", 0) == 0) {
        found = word.substr(9);
      } else if (word == "--signal") {
        std::string value;
        if (words >> value) found = value;
      }
    }
  }
  return found;
}

SlurmJobState query_slurm_job(const std::string& job_id, double timeout_seconds) {
  SlurmJobState state;
  if (const auto show = command_output({"scontrol", "show", "job", job_id}, timeout_seconds))
    if (const auto end = end_time(*show)) {
      const double left = *end - static_cast<double>(std::time(nullptr));
      state.seconds_left = left > 0 ? left : 0;
    }
  if (const auto script =
          command_output({"scontrol", "write", "batch_script", job_id, "-"}, timeout_seconds))
    state.signal = sbatch_signal_line(*script);
  return state;
}

}  // namespace gpurun

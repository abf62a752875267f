#include "distributed/worker_env.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <string_view>

#include "gpurun/errors.h"

extern char** environ;

namespace gpurun {
namespace {

const std::string* find(const Environment& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int to_int(const std::string& text, const std::string& name) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw ConfigError(name + " must be an integer, got \"" + text + "\"");
  return value;
}

int required_int(const Environment& env, const std::string& key, const std::string& context) {
  const std::string* v = find(env, key);
  if (!v) throw ConfigError(key + " is not set (" + context + ")");
  return to_int(*v, key);
}

void check_port(int port, const std::string& name) {
  if (port < 1 || port > 65535)
    throw ConfigError(name + " must be a TCP port in 1..65535, got " + std::to_string(port));
}

bool in_slurm_step(const Environment& env) {
  return find(env, "SLURM_JOB_ID") && find(env, "SLURM_PROCID") && find(env, "SLURM_NTASKS");
}

int slurm_nnodes(const Environment& env) {
  if (const std::string* v = find(env, "SLURM_JOB_NUM_NODES"))
    return to_int(*v, "SLURM_JOB_NUM_NODES");
  return required_int(env, "SLURM_NNODES", "Slurm step");
}

std::string slurm_master_addr(const Environment& env) {
  if (const std::string* v = find(env, "MASTER_ADDR")) return *v;
  const std::string* list = find(env, "SLURM_STEP_NODELIST");
  if (!list) list = find(env, "SLURM_JOB_NODELIST");
  if (!list) throw ConfigError("SLURM_JOB_NODELIST is not set: cannot tell rank 0's host");
  return first_slurm_host(*list);
}

int slurm_master_port(const Environment& env) {
  if (const std::string* v = find(env, "MASTER_PORT")) return to_int(*v, "MASTER_PORT");
  return 20000 + required_int(env, "SLURM_JOB_ID", "Slurm step") % 10000;
}

}  // namespace

Environment current_environment() {
  Environment env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string_view::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::optional<DistEnv> worker_env(const Environment& env) {
  if (!find(env, "WORLD_SIZE")) return std::nullopt;
  DistEnv d;
  const std::string context = "WORLD_SIZE is set, so this is a distributed worker";
  d.world_size = required_int(env, "WORLD_SIZE", context);
  d.rank = required_int(env, "RANK", context);
  d.local_rank = find(env, "LOCAL_RANK") ? required_int(env, "LOCAL_RANK", context) : 0;
  d.local_world_size =
      find(env, "LOCAL_WORLD_SIZE") ? required_int(env, "LOCAL_WORLD_SIZE", context) : 1;
  if (const std::string* a = find(env, "MASTER_ADDR")) d.master_addr = *a;
  if (find(env, "MASTER_PORT")) d.master_port = required_int(env, "MASTER_PORT", context);
  if (d.world_size < 1)
    throw ConfigError("WORLD_SIZE must be >= 1, got " + std::to_string(d.world_size));
  if (d.rank < 0 || d.rank >= d.world_size)
    throw ConfigError("RANK must be in 0.." + std::to_string(d.world_size - 1) + ", got " +
                      std::to_string(d.rank));
  if (d.local_world_size < 1 || d.local_rank < 0 || d.local_rank >= d.local_world_size)
    throw ConfigError("LOCAL_RANK must be in 0.." + std::to_string(d.local_world_size - 1) +
                      " (LOCAL_WORLD_SIZE), got " + std::to_string(d.local_rank));
  check_port(d.master_port, "MASTER_PORT");
  return d;
}

bool slurm_runs_workers(const Environment& env) {
  return in_slurm_step(env) && !find(env, "WORLD_SIZE") &&
         required_int(env, "SLURM_NTASKS", "Slurm step") > slurm_nnodes(env);
}

Environment worker_env_from_slurm(const Environment& env) {
  const std::string context = "Slurm step with several tasks per node";
  const int node = required_int(env, "SLURM_NODEID", context);
  int local_world = 0;
  if (const std::string* per_node = find(env, "SLURM_TASKS_PER_NODE"))
    local_world = slurm_tasks_on_node(*per_node, node);
  else
    local_world = required_int(env, "SLURM_NTASKS_PER_NODE", context);
  return {{"RANK", std::to_string(required_int(env, "SLURM_PROCID", context))},
          {"LOCAL_RANK", std::to_string(required_int(env, "SLURM_LOCALID", context))},
          {"WORLD_SIZE", std::to_string(required_int(env, "SLURM_NTASKS", context))},
          {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
          {"MASTER_ADDR", slurm_master_addr(env)},
          {"MASTER_PORT", std::to_string(slurm_master_port(env))}};
}

LaunchSpec resolve_launch(const LaunchFlags& flags, const Environment& env) {
  LaunchSpec s;
  const bool slurm = in_slurm_step(env) && !slurm_runs_workers(env);
  if (slurm) {
    s.nnodes = slurm_nnodes(env);
    s.node_rank = required_int(env, "SLURM_NODEID", "Slurm step");
    s.master_addr = slurm_master_addr(env);
    s.master_port = slurm_master_port(env);
  } else {
    if (const std::string* a = find(env, "MASTER_ADDR")) s.master_addr = *a;
    if (const std::string* p = find(env, "MASTER_PORT")) s.master_port = to_int(*p, "MASTER_PORT");
  }
  if (flags.nproc_per_node) s.nproc_per_node = *flags.nproc_per_node;
  if (flags.nnodes) s.nnodes = *flags.nnodes;
  if (flags.node_rank) s.node_rank = *flags.node_rank;
  if (flags.master_addr) s.master_addr = *flags.master_addr;
  if (flags.master_port) s.master_port = *flags.master_port;
  if (s.nproc_per_node < 1)
    throw ConfigError("--nproc-per-node must be >= 1, got " + std::to_string(s.nproc_per_node));
  if (s.nnodes < 1) throw ConfigError("--nnodes must be >= 1, got " + std::to_string(s.nnodes));
  if (s.node_rank < 0 || s.node_rank >= s.nnodes)
    throw ConfigError("--node-rank must be in 0.." + std::to_string(s.nnodes - 1) + ", got " +
                      std::to_string(s.node_rank));
  if (s.master_addr.empty()) throw ConfigError("--master-addr must not be empty");
  check_port(s.master_port, "--master-port");
  return s;
}

int find_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw IoError("socket", "127.0.0.1", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    throw IoError("bind", "0.0.0.0:0", err);
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool master_port_given(const LaunchFlags& flags, const Environment& env) {
  return flags.master_port || find(env, "MASTER_PORT") || in_slurm_step(env);
}

Environment worker_variables(const LaunchSpec& spec, int local_rank) {
  return {{"RANK", std::to_string(spec.node_rank * spec.nproc_per_node + local_rank)},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"WORLD_SIZE", std::to_string(spec.nnodes * spec.nproc_per_node)},
          {"LOCAL_WORLD_SIZE", std::to_string(spec.nproc_per_node)},
          {"MASTER_ADDR", spec.master_addr},
          {"MASTER_PORT", std::to_string(spec.master_port)}};
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
    const int count = to_int(item.substr(0, paren), "SLURM_TASKS_PER_NODE");
    int repeat = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') throw bad();
      repeat = to_int(item.substr(paren + 2, item.size() - paren - 3), "SLURM_TASKS_PER_NODE");
    }
    if (node_id < node + repeat) return count;
    node += repeat;
    at = end + 1;
  }
  throw ConfigError("SLURM_TASKS_PER_NODE \"" + tasks_per_node + "\" has no node " +
                    std::to_string(node_id));
}

}  // namespace gpurun

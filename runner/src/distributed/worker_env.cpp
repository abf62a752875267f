#include "distributed/worker_env.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include "gpurun/errors.h"

extern char** environ;

namespace gpurun {
namespace {

void check_port(int port, const std::string& name) {
  if (port < 1 || port > 65535)
    throw ConfigError(name + " must be a TCP port in 1..65535, got " + std::to_string(port));
}

}  // namespace

const std::string* env_value(const Environment& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int env_to_int(const std::string& text, const std::string& name) {
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

int required_env_int(const Environment& env, const std::string& key, const std::string& context) {
  const std::string* v = env_value(env, key);
  if (!v) throw ConfigError(key + " is not set (" + context + ")");
  return env_to_int(*v, key);
}

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
  if (!env_value(env, "WORLD_SIZE")) return std::nullopt;
  DistEnv d;
  const std::string context = "WORLD_SIZE is set, so this is a distributed worker";
  d.world_size = required_env_int(env, "WORLD_SIZE", context);
  d.rank = required_env_int(env, "RANK", context);
  d.local_rank = env_value(env, "LOCAL_RANK") ? required_env_int(env, "LOCAL_RANK", context) : 0;
  d.local_world_size =
      env_value(env, "LOCAL_WORLD_SIZE") ? required_env_int(env, "LOCAL_WORLD_SIZE", context) : 1;
  if (const std::string* a = env_value(env, "MASTER_ADDR")) d.master_addr = *a;
  if (env_value(env, "MASTER_PORT")) d.master_port = required_env_int(env, "MASTER_PORT", context);
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

LaunchSpec resolve_launch(const LaunchFlags& flags, const Environment& env) {
  LaunchSpec s;
  if (const std::string* a = env_value(env, "MASTER_ADDR")) s.master_addr = *a;
  if (const std::string* p = env_value(env, "MASTER_PORT"))
    s.master_port = env_to_int(*p, "MASTER_PORT");
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
  return flags.master_port || env_value(env, "MASTER_PORT");
}

Environment worker_variables(const LaunchSpec& spec, int local_rank) {
  return {{"RANK", std::to_string(spec.node_rank * spec.nproc_per_node + local_rank)},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"WORLD_SIZE", std::to_string(spec.nnodes * spec.nproc_per_node)},
          {"LOCAL_WORLD_SIZE", std::to_string(spec.nproc_per_node)},
          {"MASTER_ADDR", spec.master_addr},
          {"MASTER_PORT", std::to_string(spec.master_port)}};
}

}  // namespace gpurun

#include "checkpoint/storage/lease_holder.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpurun/errors.h"
#include "util/clock.h"
#include "util/fs.h"
#include "util/version.h"

namespace gpurun {
namespace {

using json = nlohmann::json;

constexpr int kLeaseFormatVersion = 2;  // 2 adds timeout, heartbeat_period, pid_start, took_over

bool valid_pid(int64_t pid) { return pid > 0 && pid <= INT_MAX; }

}  // namespace

std::string lease_path(const std::string& dir) { return dir + "/" + kLeaseFileName; }

const std::string& pid_scope() {
  static const std::string scope = [] {
    std::string boot_id;
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::getline(in, boot_id);
    char ns[128] = {};
    const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    if (boot_id.empty() || n <= 0) return std::string();
    return boot_id + "/" + std::string(ns, static_cast<size_t>(n));
  }();
  return scope;
}

int64_t process_start_ticks(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) is in parentheses and may hold spaces and ')': skip past the last.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  const char* p = stat.c_str() + close + 1;
  for (int field = 3; field < 22; ++field) {
    while (*p == ' ') ++p;
    while (*p != ' ' && *p != '\0') ++p;
  }
  char* end = nullptr;
  const long long start = std::strtoll(p, &end, 10);
  return end != p && start > 0 ? start : 0;
}

std::string lease_to_json(const LeaseHolder& h) {
  json j = {{"format_version", kLeaseFormatVersion},
            {"host", h.host},
            {"pid", h.pid},
            {"pid_start", h.pid_start},
            {"pid_scope", h.pid_scope},
            {"started", h.started},
            {"heartbeat", h.heartbeat},
            {"timeout", h.timeout},
            {"heartbeat_period", h.heartbeat_period},
            {"token", h.token},
            {"gpurun_version", gpurun_version()}};
  if (h.took_over) {
    j["took_over"] = {{"token", h.took_over->token},
                      {"forced", h.took_over->forced},
                      {"reason", h.took_over->reason}};
  }
  return j.dump(2) + "\n";
}

double lease_timeout_of(const LeaseHolder& h, double fallback) {
  return h.timeout > 0 ? h.timeout : fallback;
}

bool lease_on_this_host(const LeaseHolder& h) {
  if (h.host != host_name()) return false;
  // An old or foreign writer may not record a scope; then the hostname alone decides.
  return h.pid_scope.empty() || pid_scope().empty() || h.pid_scope == pid_scope();
}

std::string lease_stale_reason(const LeaseHolder& h, double fallback_timeout, double now) {
  if (lease_on_this_host(h)) {
    if (valid_pid(h.pid) && ::kill(static_cast<pid_t>(h.pid), 0) == 0)
      return fmt::format("pid {} on this host is now another process", h.pid);
    return fmt::format("its process (pid {}) is gone from this host", h.pid);
  }
  const double timeout = lease_timeout_of(h, fallback_timeout);
  const std::string whose = h.timeout > 0 ? "its lease_timeout" : "checkpoint.lease_timeout";
  if (!(now - h.heartbeat <= timeout))
    return fmt::format("its heartbeat is {:.1f} s old, older than {} of {:g} s", now - h.heartbeat,
                       whose, timeout);
  return fmt::format("its heartbeat did not change for {} ({:g} s) of waiting", whose, timeout);
}

std::string describe_age(double age) {
  // A negative age is another host's clock running ahead of ours.
  return age >= 0 ? fmt::format("{:.1f} s ago", age)
                  : fmt::format("{:.1f} s in the future (clock skew?)", -age);
}

double heartbeat_period_seconds(double lease_timeout_seconds) {
  return std::min(lease_timeout_seconds / 4, 10.0);
}

std::optional<LeaseHolder> read_lease(const std::string& dir) {
  return read_lease(*open_storage(dir));
}

std::optional<LeaseHolder> read_lease(const CheckpointStorage& storage) {
  std::string text;
  try {
    text = storage.read_all(kLeaseFileName);
  } catch (const IoError& e) {
    if (e.error_number() == ENOENT) return std::nullopt;
    throw;
  }
  return parse_lease(text);
}

std::optional<LeaseHolder> parse_lease(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  const auto has = [&](const char* key, json::value_t type) {
    const auto it = j.find(key);
    if (it == j.end()) return false;
    if (type == json::value_t::number_float) return it->is_number();
    if (type == json::value_t::number_integer) return it->is_number_integer();
    return it->type() == type;
  };
  if (!has("host", json::value_t::string) || !has("pid", json::value_t::number_integer) ||
      !has("heartbeat", json::value_t::number_float) || !has("token", json::value_t::string)) {
    return std::nullopt;
  }
  LeaseHolder h;
  h.host = j["host"].get<std::string>();
  h.pid = j["pid"].get<int64_t>();
  h.heartbeat = j["heartbeat"].get<double>();
  h.started =
      has("started", json::value_t::number_float) ? j["started"].get<double>() : h.heartbeat;
  h.token = j["token"].get<std::string>();
  if (has("pid_scope", json::value_t::string)) h.pid_scope = j["pid_scope"].get<std::string>();
  // Fields of format 2; a lease of an older gpurun lacks them (then 0: unknown).
  const auto positive = [&](const char* key) {
    const double v = has(key, json::value_t::number_float) ? j[key].get<double>() : 0.0;
    return std::isfinite(v) && v > 0 ? v : 0.0;
  };
  h.timeout = positive("timeout");
  h.heartbeat_period = positive("heartbeat_period");
  if (has("pid_start", json::value_t::number_integer))
    h.pid_start = std::max<int64_t>(j["pid_start"].get<int64_t>(), 0);
  const auto t = j.find("took_over");
  if (t != j.end() && t->is_object() && t->contains("token") && (*t)["token"].is_string()) {
    LeaseTakeover took;
    took.token = (*t)["token"].get<std::string>();
    took.forced =
        t->contains("forced") && (*t)["forced"].is_boolean() && (*t)["forced"].get<bool>();
    if (t->contains("reason") && (*t)["reason"].is_string())
      took.reason = (*t)["reason"].get<std::string>();
    h.took_over = took;
  }
  if (h.token.empty() || !valid_pid(h.pid) || !std::isfinite(h.heartbeat)) return std::nullopt;
  return h;
}

bool lease_holder_alive_here(const LeaseHolder& h) {
  if (!lease_on_this_host(h) || !valid_pid(h.pid)) return false;
  // EPERM means the process exists under another user: alive.
  if (::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH) return false;
  // A pid that another process got after the holder died (the pid was reused).
  if (h.pid_start > 0) {
    const int64_t start = process_start_ticks(h.pid);
    if (start > 0 && start != h.pid_start) return false;
  }
  return true;
}

bool lease_is_stale(const LeaseHolder& h, double fallback_timeout_seconds, double now) {
  // Here the process itself says whether the holder lives; its heartbeat's age says nothing
  // more (a live run may stall, and the reader's timeout is not the holder's).
  if (lease_on_this_host(h)) return !lease_holder_alive_here(h);
  return !(now - h.heartbeat <= lease_timeout_of(h, fallback_timeout_seconds));  // true for NaN too
}

std::string describe_lease_holder(const LeaseHolder& h, double now) {
  return fmt::format("host {}, pid {}, heartbeat {}, started {}", h.host, h.pid,
                     describe_age(now - h.heartbeat), describe_age(now - h.started));
}

}  // namespace gpurun

#include "checkpoint/lease.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <utility>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "gpurun/errors.h"
#include "util/fs.h"
#include "util/clock.h"
#include "util/version.h"


namespace gpurun {
namespace {

using json = nlohmann::json;
using Seconds = std::chrono::duration<double>;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* kLeaseFile = "lease.json";
constexpr int kLeaseFormatVersion = 1;
constexpr double kPollSeconds = 0.2;       // how often a waiting run re-reads lease.json
constexpr double kProgressSeconds = 10.0;  // how often a waiting run says it still waits
constexpr int kMaxForceAttempts = 5;       // writes --force makes against the displaced holder

std::string lease_path(const std::string& dir) { return dir + "/" + kLeaseFile; }

// Where a pid means something: the boot (a reboot reuses pids) and the pid namespace (two
// containers on one machine, possibly with one hostname, number their processes apart).
// Empty when /proc is unavailable.
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

// 128 random bits as 32 hex digits. std::random_device reads getrandom(2) on Linux; the pid
// and the clock are mixed in so that a degenerate random_device still gives distinct tokens.
std::string new_token() {
  std::random_device rd;
  uint64_t words[2];
  for (auto& w : words) w = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  words[0] ^= static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ULL;
  words[1] ^= static_cast<uint64_t>(SteadyClock::now().time_since_epoch().count());
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(words[0]),
                static_cast<unsigned long long>(words[1]));
  return buf;
}

std::string to_json(const LeaseHolder& h) {
  const json j = {{"format_version", kLeaseFormatVersion},
                  {"host", h.host},
                  {"pid", h.pid},
                  {"started", h.started},
                  {"heartbeat", h.heartbeat},
                  {"token", h.token},
                  {"pid_scope", h.pid_scope},
                  {"gpurun_version", gpurun_version()}};
  return j.dump(2) + "\n";
}

bool valid_pid(int64_t pid) { return pid > 0 && pid <= INT_MAX; }

bool same_host(const LeaseHolder& h) {
  if (h.host != host_name()) return false;
  // An old or foreign writer may not record a scope; then the hostname alone decides.
  return h.pid_scope.empty() || pid_scope().empty() || h.pid_scope == pid_scope();
}

bool pid_dead_here(const LeaseHolder& h) {
  if (!same_host(h)) return false;
  // EPERM means the process exists under another user: alive.
  return ::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH;
}

// Why a stale lease is stale, for the log.
std::string stale_reason(const LeaseHolder& h, double lease_timeout_seconds, double now) {
  if (pid_dead_here(h)) return "its process is gone";
  if (now - h.heartbeat > lease_timeout_seconds) {
    return "its heartbeat is older than " + fmt::format("{:g}", lease_timeout_seconds) + " s";
  }
  return "its heartbeat did not change for " + fmt::format("{:g}", lease_timeout_seconds) +
         " s of waiting";
}

// Identity of one heartbeat of one holder: a change means the holder is alive (or replaced).
std::pair<std::string, double> beat_of(const std::optional<LeaseHolder>& h) {
  return h ? std::make_pair(h->token, h->heartbeat) : std::make_pair(std::string(), -1.0);
}

std::atomic<unsigned> temp_counter{0};

// Writes `data` to a temporary file beside DIR/lease.json (with fsync, the slow part), then
// re-reads the lease and renames the file over it only when `expect(current lease)` holds;
// the window in which a concurrent writer can slip in is from that read to the rename, not
// the whole write. Returns whether it replaced the lease. Throws IoError.
// The temporary name carries pid, owner token and a counter, so it never meets another
// lease's nor fs::replace_file's (".lease.json.tmp-PID-N") in this or another process.
template <typename Expect>
bool replace_lease_if(const std::string& dir, const std::string& token, const std::string& data,
                      Expect&& expect) {
  const std::string tmp = dir + "/." + kLeaseFile + ".tmp-" + std::to_string(::getpid()) + "-" +
                          token.substr(0, 8) + "-" + std::to_string(temp_counter++);
  try {
    fs::write_file(tmp, data);
    if (!expect(read_lease(dir))) {
      ::unlink(tmp.c_str());
      return false;
    }
    fs::rename_durable(tmp, lease_path(dir));
    return true;
  } catch (...) {
    ::unlink(tmp.c_str());  // best effort; the error that matters is the one rethrown
    throw;
  }
}

void sleep_seconds(double s) {
  if (s > 0) std::this_thread::sleep_for(Seconds(s));
}

}  // namespace

double heartbeat_period_seconds(double lease_timeout_seconds) {
  return std::min(lease_timeout_seconds / 4, 10.0);
}

std::optional<LeaseHolder> read_lease(const std::string& dir) {
  std::string text;
  try {
    text = fs::read_file(lease_path(dir));
  } catch (const IoError& e) {
    if (e.error_number() == ENOENT) return std::nullopt;
    throw;
  }
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
  if (h.token.empty() || !valid_pid(h.pid) || !std::isfinite(h.heartbeat)) return std::nullopt;
  return h;
}

bool lease_is_stale(const LeaseHolder& h, double lease_timeout_seconds, double now) {
  if (!(now - h.heartbeat <= lease_timeout_seconds)) return true;  // also true for NaN
  return valid_pid(h.pid) ? pid_dead_here(h) : same_host(h);
}

std::string describe_lease_holder(const LeaseHolder& h, double now) {
  const auto ago = [](double age) {
    // A negative age is another host's clock running ahead of ours.
    return age >= 0 ? fmt::format("{:.1f} s ago", age)
                    : fmt::format("{:.1f} s in the future (clock skew?)", -age);
  };
  return fmt::format("host {}, pid {}, heartbeat {}, started {}", h.host, h.pid,
                     ago(now - h.heartbeat), ago(now - h.started));
}

std::unique_ptr<Lease> Lease::acquire(const std::string& dir, double lease_timeout_seconds,
                                      bool force) {
  if (!(lease_timeout_seconds > 0) || !std::isfinite(lease_timeout_seconds)) {
    throw ConfigError("checkpoint.lease_timeout must be a number of seconds > 0, got " +
                      fmt::format("{:g}", lease_timeout_seconds));
  }
  const double timeout = lease_timeout_seconds;
  fs::make_dirs(dir);

  LeaseHolder me;
  me.host = host_name();
  me.pid = ::getpid();
  me.token = new_token();
  me.pid_scope = pid_scope();

  const auto start = SteadyClock::now();
  // (Capped at ~30 years so that the deadline cannot overflow the clock.)
  const auto deadline =
      start + std::chrono::duration_cast<SteadyClock::duration>(Seconds(std::min(timeout, 1e9)));
  auto last_progress = start;
  bool warned = false;
  int force_attempts = 0;
  // The holder's last heartbeat as we saw it, and since when (our steady clock): a heartbeat
  // that stays the same for `timeout` of our own time is stale whatever the clocks say.
  // The first one counts from `start`, so that a silent holder is stale exactly at the deadline.
  std::optional<std::pair<std::string, double>> seen_beat;
  auto seen_since = start;

  for (;;) {
    const auto steady_now = SteadyClock::now();
    const std::optional<LeaseHolder> cur = read_lease(dir);
    const double now = unix_seconds();
    if (!seen_beat) {
      seen_beat = beat_of(cur);
    } else if (beat_of(cur) != *seen_beat) {
      seen_beat = beat_of(cur);
      seen_since = steady_now;
    }
    const bool silent = Seconds(steady_now - seen_since).count() >= timeout;
    const bool stale = !cur || lease_is_stale(*cur, timeout, now) || silent;

    if (stale || force) {
      if (cur && stale) {
        spdlog::info("taking over the stale lease of {} ({}): {}", dir,
                     describe_lease_holder(*cur, now), stale_reason(*cur, timeout, now));
      } else if (cur) {
        spdlog::warn("--force: taking the lease of {} from a live run ({})", dir,
                     describe_lease_holder(*cur, now));
      }
      // Replace only what we judged: if the lease changed since it was read (the holder
      // beat, or another run took it), judge again.
      me.started = me.heartbeat = unix_seconds();
      const auto judged = *seen_beat;
      if (replace_lease_if(dir, me.token, to_json(me),
                           [&](const std::optional<LeaseHolder>& now_there) {
                             return beat_of(now_there) == judged;
                           })) {
        sleep_seconds(kVerifyDelaySeconds);
        const std::optional<LeaseHolder> check = read_lease(dir);
        if (check && check->token == me.token) {
          std::unique_ptr<Lease> lease(new Lease(dir, timeout, me));
          lease->thread_ = std::thread(&Lease::heartbeat_loop, lease.get());
          spdlog::info("holding the lease of {} (heartbeat every {:g} s)", dir, lease->period_);
          return lease;
        }
        // With --force, a heartbeat of the holder we displace may land on our write; its next
        // beat will see ours, so we write again (a few times). A third run's token means a
        // concurrent taker: --force does not fight it, it waits like any run.
        const bool clobbered_by_forced = check && check->token == judged.first;
        if (!clobbered_by_forced || ++force_attempts >= kMaxForceAttempts) force = false;
        if (check && !force) {
          spdlog::info("another run took the lease of {} at the same time ({}); waiting", dir,
                       describe_lease_holder(*check, unix_seconds()));
        }
      }
      continue;
    }

    if (!warned) {
      spdlog::warn(
          "{} is held by a live run ({}); waiting up to {:g} s (checkpoint.lease_timeout) for "
          "it to stop",
          dir, describe_lease_holder(*cur, now), timeout);
      warned = true;
    } else if (Seconds(steady_now - last_progress).count() >= kProgressSeconds) {
      spdlog::info("still waiting for the lease of {} ({}); {:.0f} s left", dir,
                   describe_lease_holder(*cur, now), Seconds(deadline - steady_now).count());
      last_progress = steady_now;
    }
    if (steady_now >= deadline) {
      throw ConfigError(fmt::format(
          "checkpoint directory {} is in use by another run ({}), still alive after waiting "
          "{:g} s (checkpoint.lease_timeout); stop that run, use another --ckpt directory, or "
          "pass --force to take it over",
          dir, describe_lease_holder(*cur, now), timeout));
    }
    sleep_seconds(std::min(kPollSeconds, Seconds(deadline - steady_now).count()));
  }
}

Lease::Lease(std::string dir, double lease_timeout_seconds, LeaseHolder me)
    : dir_(std::move(dir)),
      path_(lease_path(dir_)),
      token_(me.token),
      period_(heartbeat_period_seconds(lease_timeout_seconds)),
      me_(std::move(me)) {}

Lease::~Lease() { release(); }

bool Lease::check_owner(const std::optional<LeaseHolder>& h) const {
  if (!h || h->token == token_) return true;
  if (!lost_.exchange(true)) {
    spdlog::error(
        "lost the lease of {} to another run ({}), probably started with --force; this run "
        "must stop writing checkpoints there",
        dir_, describe_lease_holder(*h, unix_seconds()));
  }
  return false;
}

void Lease::heartbeat() {
  std::lock_guard<std::mutex> io(io_mu_);
  LeaseHolder next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_ || lost_) return;
    next = me_;
  }
  next.heartbeat = unix_seconds();
  if (!replace_lease_if(dir_, token_, to_json(next),
                        [this](const std::optional<LeaseHolder>& h) { return check_owner(h); })) {
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  me_.heartbeat = next.heartbeat;
}

void Lease::heartbeat_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stop_cv_.wait_for(lock, Seconds(period_), [this] { return stop_; })) return;
    lock.unlock();
    try {
      heartbeat();
    } catch (const std::exception& e) {
      // The next beat tries again; a run that cannot beat for lease_timeout may be taken
      // over, which the next successful read notices (lost()).
      spdlog::warn("lease heartbeat of {} failed: {}", dir_, e.what());
    }
    if (lost_) return;
    lock.lock();
  }
}

bool Lease::still_ours() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_ || lost_) return false;
  }
  return check_owner(read_lease(dir_));
}

bool Lease::lost() const { return lost_; }

LeaseHolder Lease::holder() const {
  std::lock_guard<std::mutex> lock(mu_);
  return me_;
}

void Lease::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  std::call_once(join_once_, [this] {
    if (thread_.joinable()) thread_.join();
  });
  std::lock_guard<std::mutex> io(io_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_) return;
    released_ = true;
  }
  if (lost_) return;
  try {
    const std::optional<LeaseHolder> h = read_lease(dir_);
    if (!h || h->token != token_) return;  // gone, or someone else's now: not ours to remove
    if (::unlink(path_.c_str()) != 0 && errno != ENOENT) throw IoError("unlink", path_, errno);
    fs::sync_dir(dir_);
  } catch (const std::exception& e) {
    spdlog::warn("could not remove the lease {}: {}", path_, e.what());
  }
}

}  // namespace gpurun

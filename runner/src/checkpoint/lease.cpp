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
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <utility>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "gpurun/errors.h"
#include "util/clock.h"
#include "util/detached_call.h"
#include "util/fs.h"
#include "util/version.h"

namespace gpurun {
namespace {

using json = nlohmann::json;
using Seconds = std::chrono::duration<double>;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* kLeaseFile = "lease.json";
constexpr int kLeaseFormatVersion = 2;     // 2 adds timeout, heartbeat_period, pid_start, took_over
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

// The start time of process `pid` in clock ticks since boot (field 22 of /proc/PID/stat), which
// tells a live holder from another process that got its pid; 0 when unknown.
int64_t process_start(int64_t pid) {
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

std::string to_json(const LeaseHolder& h) {
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

bool valid_pid(int64_t pid) { return pid > 0 && pid <= INT_MAX; }

// The timeout by which `h` goes stale: its own, or `fallback` for a lease that records none.
double timeout_of(const LeaseHolder& h, double fallback) {
  return h.timeout > 0 ? h.timeout : fallback;
}

bool same_host(const LeaseHolder& h) {
  if (h.host != host_name()) return false;
  // An old or foreign writer may not record a scope; then the hostname alone decides.
  return h.pid_scope.empty() || pid_scope().empty() || h.pid_scope == pid_scope();
}

// Why a stale lease is stale, for the log and the taker's `took_over.reason`.
std::string stale_reason(const LeaseHolder& h, double fallback_timeout, double now) {
  if (same_host(h)) {
    if (valid_pid(h.pid) && ::kill(static_cast<pid_t>(h.pid), 0) == 0)
      return fmt::format("pid {} on this host is now another process", h.pid);
    return fmt::format("its process (pid {}) is gone from this host", h.pid);
  }
  const double timeout = timeout_of(h, fallback_timeout);
  const std::string whose = h.timeout > 0 ? "its lease_timeout" : "checkpoint.lease_timeout";
  if (!(now - h.heartbeat <= timeout))
    return fmt::format("its heartbeat is {:.1f} s old, older than {} of {:g} s", now - h.heartbeat,
                       whose, timeout);
  return fmt::format("its heartbeat did not change for {} ({:g} s) of waiting", whose, timeout);
}

std::string ago(double age) {
  // A negative age is another host's clock running ahead of ours.
  return age >= 0 ? fmt::format("{:.1f} s ago", age)
                  : fmt::format("{:.1f} s in the future (clock skew?)", -age);
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
  if (!same_host(h) || !valid_pid(h.pid)) return false;
  // EPERM means the process exists under another user: alive.
  if (::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH) return false;
  // A pid that another process got after the holder died (the pid was reused).
  if (h.pid_start > 0) {
    const int64_t start = process_start(h.pid);
    if (start > 0 && start != h.pid_start) return false;
  }
  return true;
}

bool lease_is_stale(const LeaseHolder& h, double fallback_timeout_seconds, double now) {
  // Here the process itself says whether the holder lives; its heartbeat's age says nothing
  // more (a live run may stall, and the reader's timeout is not the holder's).
  if (same_host(h)) return !lease_holder_alive_here(h);
  return !(now - h.heartbeat <= timeout_of(h, fallback_timeout_seconds));  // true for NaN too
}

std::string describe_lease_holder(const LeaseHolder& h, double now) {
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
  me.pid_start = process_start(me.pid);
  me.token = new_token();
  me.pid_scope = pid_scope();
  me.timeout = timeout;
  me.heartbeat_period = heartbeat_period_seconds(timeout);

  const auto start = SteadyClock::now();
  auto last_progress = start;
  bool warned = false;
  int force_attempts = 0;
  // The holder's last heartbeat as we saw it, and since when (our steady clock): a heartbeat
  // of another host that stays the same for its timeout of our own time is stale whatever the
  // clocks say. The first one counts from `start`, so that a silent holder is stale exactly
  // at the end of the wait.
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
    const bool local = cur && same_host(*cur);
    const double their_timeout = cur ? timeout_of(*cur, timeout) : timeout;
    const bool silent = cur && !local && Seconds(steady_now - seen_since).count() >= their_timeout;
    const bool stale = !cur || lease_is_stale(*cur, timeout, now) || silent;
    // A local holder is judged by its process at every poll; one elsewhere only by its own
    // timeout, so the wait lasts at least that long. (Capped at ~30 years against overflow.)
    const double wait = std::min(local ? timeout : std::max(timeout, their_timeout), 1e9);
    const auto deadline = start + std::chrono::duration_cast<SteadyClock::duration>(Seconds(wait));

    if (stale || force) {
      me.took_over.reset();
      if (cur && stale) {
        const std::string reason = stale_reason(*cur, timeout, now);
        spdlog::info("taking over the stale lease of {} ({}): {}", dir,
                     describe_lease_holder(*cur, now), reason);
        me.took_over = LeaseTakeover{cur->token, false, reason};
      } else if (cur) {
        spdlog::warn("--force: taking the lease of {} from a live run ({})", dir,
                     describe_lease_holder(*cur, now));
        me.took_over = LeaseTakeover{cur->token, true, "--force"};
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
      spdlog::warn("{} is held by a live run ({}{}); waiting up to {:g} s for it to stop", dir,
                   describe_lease_holder(*cur, now), local ? ", its process runs on this host" : "",
                   wait);
      warned = true;
    } else if (Seconds(steady_now - last_progress).count() >= kProgressSeconds) {
      spdlog::info("still waiting for the lease of {} ({}); {:.0f} s left", dir,
                   describe_lease_holder(*cur, now), Seconds(deadline - steady_now).count());
      last_progress = steady_now;
    }
    if (steady_now >= deadline) {
      throw ConfigError(fmt::format(
          "checkpoint directory {} is in use by another run ({}), still alive after waiting "
          "{:g} s{}; stop that run, use another --ckpt directory, or pass --force to take it "
          "over",
          dir, describe_lease_holder(*cur, now), wait,
          local ? " (its process runs on this host)" : ""));
    }
    sleep_seconds(std::min(kPollSeconds, Seconds(deadline - steady_now).count()));
  }
}

Lease::Lease(std::string dir, double lease_timeout_seconds, LeaseHolder me)
    : dir_(std::move(dir)),
      path_(lease_path(dir_)),
      token_(me.token),
      timeout_(lease_timeout_seconds),
      period_(heartbeat_period_seconds(lease_timeout_seconds)),
      me_(std::move(me)),
      last_beat_(SteadyClock::now()) {}

Lease::~Lease() { release(); }

bool Lease::check_owner(const std::optional<LeaseHolder>& h) const {
  if (!h || h->token == token_) return true;
  if (lost_) return false;
  const double now = unix_seconds();
  std::string how;
  if (h->took_over && h->took_over->token == token_) {
    how = h->took_over->forced ? "took it with --force"
                               : "took it over as stale (" + h->took_over->reason + ")";
  } else {
    how =
        "replaced it without recording that it took it from this run (an older gpurun, or "
        "lease.json was written by hand)";
  }
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    message = fmt::format(
        "lost the lease of {}: a run on host {}, pid {} {} {}; this run's last heartbeat was "
        "written {}",
        dir_, h->host, h->pid, how, ago(now - h->started), ago(now - me_.heartbeat));
    if (trouble_.empty()) trouble_ = message;
  }
  if (!lost_.exchange(true))
    spdlog::error("{}; this run must stop writing checkpoints there", message);
  return false;
}

void Lease::heartbeat() {
  std::lock_guard<std::mutex> io(io_mu_);
  LeaseHolder next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_ || lost_ || expired_) return;
    next = me_;
  }
  next.heartbeat = unix_seconds();
  if (!replace_lease_if(dir_, token_, to_json(next),
                        [this](const std::optional<LeaseHolder>& h) { return check_owner(h); })) {
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  me_.heartbeat = next.heartbeat;
  last_beat_ = SteadyClock::now();
  last_error_.clear();
}

void Lease::heartbeat_loop() {
  struct Finished {
    Lease* lease;
    ~Finished() {
      std::lock_guard<std::mutex> guard(lease->mu_);
      lease->thread_finished_ = true;
      lease->stop_cv_.notify_all();
    }
  } finished{this};
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stop_cv_.wait_for(lock, Seconds(period_), [this] { return stop_; })) {
      lock.unlock();
      remove_if_ours();  // here, so that release() can give up on storage that hangs
      return;
    }
    lock.unlock();
    try {
      heartbeat();
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> guard(mu_);
        last_error_ = e.what();
      }
      if (step_down(std::string("last error: ") + e.what())) return;
      spdlog::warn(
          "lease heartbeat of {} failed: {}; retrying in {:g} s (the run stops when no "
          "heartbeat is written for {:g} s)",
          dir_, e.what(), period_, timeout_);
    }
    if (lost_) return;
    lock.lock();
  }
}

bool Lease::still_ours() const {
  std::shared_ptr<DetachedCall<std::optional<LeaseHolder>>> read;
  bool started = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_ || lost_ || expired_) return false;
    // One read at a time: while one hangs, the next saves neither add another nor wait.
    if (!pending_read_) {
      started = true;
      pending_read_ =
          DetachedCall<std::optional<LeaseHolder>>::start([dir = dir_] { return read_lease(dir); });
    }
    read = pending_read_;
  }
  if (!read->wait_for(started ? kReadWaitSeconds : 0)) {
    if (!warned_unanswered_.exchange(true))
      spdlog::warn(
          "the lease {} could not be read within {:g} s (its storage does not answer); saving "
          "on the heartbeat's word, which keeps the lease until checkpoint.lease_timeout",
          path_, kReadWaitSeconds);
    return !expired();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_read_ == read) pending_read_.reset();
  }
  warned_unanswered_ = false;
  return check_owner(read->get());
}

bool Lease::lost() const { return lost_; }

bool Lease::expired() const {
  if (expired_) return true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_) return false;
  }
  // A heartbeat that fails says so (heartbeat_loop); one stuck in storage that does not answer
  // says nothing, so the time since the last one written decides, by the same rule. Either
  // side may see the expiry first: both name the last error a heartbeat met, if one did.
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    error = last_error_;
  }
  return step_down(error.empty() ? std::string("the storage does not answer")
                                 : "last error: " + error);
}

bool Lease::step_down(const std::string& cause) const {
  double silent = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    silent = Seconds(SteadyClock::now() - last_beat_).count();
  }
  // Before other hosts may see the lease as expired: when the next beat would come too late,
  // this run can no longer count on holding the lease.
  if (silent + period_ < timeout_) return false;
  const std::string message = fmt::format(
      "the lease of {} expired: no heartbeat could be written for {:.1f} s of its {:g} s "
      "checkpoint.lease_timeout ({}), so another machine may take the directory over",
      dir_, silent, timeout_, cause);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (trouble_.empty()) trouble_ = message;
  }
  if (!expired_.exchange(true))
    spdlog::error("{}; this run must stop writing checkpoints there", message);
  return true;
}

std::string Lease::trouble() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_ || expired_ ? trouble_ : std::string();
}

LeaseHolder Lease::holder() const {
  std::lock_guard<std::mutex> lock(mu_);
  return me_;
}

bool Lease::release(double wait_seconds) {
  bool finished = true;
  {
    std::unique_lock<std::mutex> lock(mu_);
    stop_ = true;
    stop_cv_.notify_all();
    if (thread_.joinable()) {
      const auto done = [this] { return thread_finished_; };
      if (wait_seconds < 0)
        stop_cv_.wait(lock, done);
      else
        finished = stop_cv_.wait_for(lock, Seconds(wait_seconds), done);
    }
  }
  if (!finished) {
    std::call_once(join_once_, [this] { thread_.detach(); });
    spdlog::warn(
        "the lease {} could not be released within {:g} s (its storage does not answer); it "
        "goes stale by itself after checkpoint.lease_timeout",
        path_, wait_seconds);
    return false;
  }
  std::call_once(join_once_, [this] {
    if (thread_.joinable()) thread_.join();
  });
  remove_if_ours();  // done by the thread when it ran; a no-op then
  return true;
}

void Lease::remove_if_ours() {
  std::lock_guard<std::mutex> io(io_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_) return;
    released_ = true;
  }
  // Lost: not ours. Expired: the storage failed, and another run may hold it by now.
  if (lost_ || expired_) return;
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

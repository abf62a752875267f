#include "checkpoint/storage/lease.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <utility>

#include <spdlog/spdlog.h>

#include "gpurun/errors.h"
#include "util/clock.h"
#include "util/detached_call.h"
#include "util/error_report.h"
#include "util/fs.h"
#include "util/signals.h"

namespace gpurun {
namespace {

using Seconds = std::chrono::duration<double>;
using SteadyClock = std::chrono::steady_clock;

constexpr double kPollSeconds = 0.2;       // how often a waiting run re-reads lease.json
constexpr double kProgressSeconds = 10.0;  // how often a waiting run says it still waits
constexpr int kMaxForceAttempts = 5;       // writes --force makes against the displaced holder

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

// Identity of one heartbeat of one holder: a change means the holder is alive (or replaced).
std::pair<std::string, double> beat_of(const std::optional<LeaseHolder>& h) {
  return h ? std::make_pair(h->token, h->heartbeat) : std::make_pair(std::string(), -1.0);
}

// Writes `data` as the lease when `expect(current lease)` holds (CheckpointStorage::replace_if():
// on a file system the window in which a concurrent writer can slip in is from the re-read to
// the rename, not the whole write; in a bucket If-Match / If-None-Match close it). Returns
// whether it replaced the lease. Throws IoError.
template <typename Expect>
bool replace_lease_if(CheckpointStorage& storage, const std::string& data, Expect&& expect) {
  return storage.replace_if(kLeaseFileName, data, [&](const std::optional<std::string>& text) {
    return expect(text ? parse_lease(*text) : std::nullopt);
  });
}

void sleep_seconds(double s) {
  if (s > 0) std::this_thread::sleep_for(Seconds(s));
}

}  // namespace

std::unique_ptr<Lease> Lease::acquire(const std::string& dir, double lease_timeout_seconds,
                                      bool force) {
  return acquire(open_storage(dir), lease_timeout_seconds, force);
}

std::unique_ptr<Lease> Lease::acquire(std::shared_ptr<CheckpointStorage> storage,
                                      double lease_timeout_seconds, bool force) {
  const std::string dir = storage->root();
  if (!(lease_timeout_seconds > 0) || !std::isfinite(lease_timeout_seconds)) {
    throw ConfigError("checkpoint.lease_timeout must be a number of seconds > 0, got " +
                      fmt::format("{:g}", lease_timeout_seconds));
  }
  const double timeout = lease_timeout_seconds;

  LeaseHolder me;
  me.host = host_name();
  me.pid = ::getpid();
  me.pid_start = process_start_ticks(me.pid);
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
    const std::optional<LeaseHolder> cur = read_lease(*storage);
    const double now = unix_seconds();
    if (!seen_beat) {
      seen_beat = beat_of(cur);
    } else if (beat_of(cur) != *seen_beat) {
      seen_beat = beat_of(cur);
      seen_since = steady_now;
    }
    const bool local = cur && lease_on_this_host(*cur);
    const double their_timeout = cur ? lease_timeout_of(*cur, timeout) : timeout;
    const bool silent = cur && !local && Seconds(steady_now - seen_since).count() >= their_timeout;
    const bool stale = !cur || lease_is_stale(*cur, timeout, now) || silent;
    // A local holder is judged by its process at every poll; one elsewhere only by its own
    // timeout, so the wait lasts at least that long. (Capped at ~30 years against overflow.)
    const double wait = std::min(local ? timeout : std::max(timeout, their_timeout), 1e9);
    const auto deadline = start + std::chrono::duration_cast<SteadyClock::duration>(Seconds(wait));

    if (stale || force) {
      me.took_over.reset();
      if (cur && stale) {
        const std::string reason = lease_stale_reason(*cur, timeout, now);
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
      if (replace_lease_if(*storage, lease_to_json(me),
                           [&](const std::optional<LeaseHolder>& now_there) {
                             return beat_of(now_there) == judged;
                           })) {
        sleep_seconds(kVerifyDelaySeconds);
        const std::optional<LeaseHolder> check = read_lease(*storage);
        if (check && check->token == me.token) {
          std::unique_ptr<Lease> lease(new Lease(storage, timeout, me));
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
    // A stop signal ends the wait: nothing of this run is there to save (exit 75).
    if (const int sig = stop_signal()) throw Stopped(sig);
    if (steady_now >= deadline) {
      throw LeaseHeld(fmt::format(
          "checkpoint directory {} is in use by another run ({}), still alive after waiting "
          "{:g} s{}; stop that run, use another --ckpt directory, or pass --force to take it "
          "over",
          dir, describe_lease_holder(*cur, now), wait,
          local ? " (its process runs on this host)" : ""));
    }
    sleep_seconds(std::min(kPollSeconds, Seconds(deadline - steady_now).count()));
  }
}

Lease::Lease(std::shared_ptr<CheckpointStorage> storage, double lease_timeout_seconds,
             LeaseHolder me)
    : storage_(std::move(storage)),
      dir_(storage_->root()),
      path_(storage_->path(kLeaseFileName)),
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
        dir_, h->host, h->pid, how, describe_age(now - h->started),
        describe_age(now - me_.heartbeat));
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
  if (!replace_lease_if(*storage_, lease_to_json(next),
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
      pending_read_ = DetachedCall<std::optional<LeaseHolder>>::start(
          [storage = storage_] { return read_lease(*storage); });
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

std::string Lease::heartbeat_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
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
    // Gone, or someone else's now: not ours to remove.
    storage_->remove_if(kLeaseFileName, [this](const std::optional<std::string>& text) {
      const std::optional<LeaseHolder> h = text ? parse_lease(*text) : std::nullopt;
      return h && h->token == token_;
    });
  } catch (const std::exception& e) {
    spdlog::warn("could not remove the lease {}: {}", path_, e.what());
  }
}

}  // namespace gpurun

#include "checkpoint/tier_copy.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>

#include "gpurun/errors.h"

namespace gpurun {

namespace {
using Clock = std::chrono::steady_clock;

// While the end of a run waits for its final copy: a failed copy is tried again after at
// most 2 s, so that a network blip of a second or two does not fail the run's end.
constexpr std::chrono::seconds kUrgentRetry(2);

// 1 s after the first failure, doubling, at most 60 s: a network tier that is down for an hour
// costs a few dozen attempts, and one that comes back is caught up within a minute.
double backoff_seconds(int64_t failures) {
  return std::min(60.0, static_cast<double>(int64_t{1} << std::min<int64_t>(failures - 1, 6)));
}
}  // namespace

struct TierCopier::Shared {
  std::unique_ptr<CheckpointStore> network;
  std::mutex mutex;
  std::condition_variable changed;
  std::optional<std::pair<std::string, int64_t>> pending;  ///< folder, global step
  std::vector<Outcome> done;
  int64_t copied_step = -1;
  int64_t failures = 0;            ///< in a row
  int64_t failed_attempts = 0;     ///< in all, for wait_for()
  Clock::time_point not_before{};  ///< the backoff: no attempt starts earlier
  Clock::time_point failed_at{};   ///< the end of the last failed attempt
  bool urgent = false;             ///< wait_for() is waiting: the backoff is cut to kUrgentRetry

  /// When the next attempt may start.
  Clock::time_point next_attempt() const {
    return urgent ? std::min(not_before, failed_at + kUrgentRetry) : not_before;
  }
  bool copying = false, stopping = false;
  std::atomic<int> holds{0};  ///< hold_function()'s holders: the copy pauses between chunks
  std::string reading;        ///< the local checkpoint being copied, spared by local retention

  explicit Shared(std::unique_ptr<CheckpointStore> n) : network(std::move(n)) {}
};

TierCopier::TierCopier(std::unique_ptr<CheckpointStore> network, CheckpointStore& protect)
    : shared_(std::make_shared<Shared>(std::move(network))) {
  protect.set_retention_guard([s = shared_](const std::string& name) {
    std::lock_guard<std::mutex> lock(s->mutex);
    return name == s->reading;
  });
  std::thread([s = shared_] { loop(s); }).detach();
}

TierCopier::~TierCopier() {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  shared_->stopping = true;
  shared_->changed.notify_all();
  shared_->changed.wait_for(lock, std::chrono::seconds(1), [&] { return !shared_->copying; });
  // The thread holds its own reference to the shared state and ends after its copy.
}

void TierCopier::offer(const std::string& folder, int64_t global_step) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  if (global_step <= shared_->copied_step) return;
  if (shared_->pending && shared_->pending->second > global_step) return;
  shared_->pending = std::make_pair(folder, global_step);
  shared_->changed.notify_all();
}

std::vector<TierCopier::Outcome> TierCopier::finished() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  std::vector<Outcome> out;
  out.swap(shared_->done);
  return out;
}

std::function<void(bool)> TierCopier::hold_function() const {
  return [s = shared_](bool held) { s->holds.fetch_add(held ? 1 : -1, std::memory_order_relaxed); };
}

int64_t TierCopier::copied_step() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->copied_step;
}

bool TierCopier::wait_for(int64_t global_step, int64_t max_failures, double seconds,
                          const std::function<bool()>& give_up) {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  // Counted by a total that only grows: read whenever this thread gets the lock, it cannot
  // miss a failure, however soon the copier starts its next attempt.
  const int64_t failed_before = shared_->failed_attempts;
  shared_->urgent = true;
  shared_->changed.notify_all();
  const auto done = [&] {
    return shared_->copied_step >= global_step ||
           shared_->failed_attempts - failed_before >= max_failures ||
           (!shared_->copying && !shared_->pending);
  };
  const auto deadline = seconds > 0 ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                         std::chrono::duration<double>(seconds))
                                    : Clock::time_point::max();
  while (!done() && Clock::now() < deadline) {
    shared_->changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::seconds(1)),
                                done);
    if (done() || !give_up) continue;
    lock.unlock();
    const bool stop = give_up();
    lock.lock();
    if (stop) break;
  }
  shared_->urgent = false;
  return shared_->copied_step >= global_step;
}

void TierCopier::loop(std::shared_ptr<Shared> s) {
  // A background copy yields to training: the lowest best-effort I/O priority, and nice 10
  // (both per thread on Linux). Failing to lower them only costs speed.
  const auto tid = static_cast<int>(::syscall(SYS_gettid));
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 10);
  constexpr int kIoprioWhoProcess = 1, kIoprioClassBestEffort = 2, kIoprioClassShift = 13;
  (void)::syscall(SYS_ioprio_set, kIoprioWhoProcess, tid,
                  (kIoprioClassBestEffort << kIoprioClassShift) | 7);
  std::unique_lock<std::mutex> lock(s->mutex);
  for (;;) {
    s->changed.wait(lock, [&] { return s->pending.has_value() || s->stopping; });
    if (s->stopping) return;
    if (Clock::now() < s->next_attempt()) {
      // Woken early by a stop, or by wait_for() cutting the backoff short.
      const bool was_urgent = s->urgent;
      s->changed.wait_until(lock, s->next_attempt(),
                            [&] { return s->stopping || (s->urgent && !was_urgent); });
      continue;
    }
    const auto [folder, step] = *s->pending;
    s->pending.reset();
    s->copying = true;
    const std::string name = std::filesystem::path(folder).filename().string();
    s->reading = name;
    lock.unlock();

    Outcome outcome;
    outcome.source = folder;
    outcome.global_step = step;
    try {
      outcome.result = s->network->copy_from(folder, [&s] {
        // Bounded: a local save that hangs must not hang the network copy with it.
        for (int i = 0; i < 3000 && s->holds.load(std::memory_order_relaxed) > 0; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
      });
    } catch (const IoError& e) {
      outcome.error = e.what();
      outcome.error_number = e.error_number();
    } catch (const std::exception& e) {
      outcome.error = e.what();
    }

    lock.lock();
    s->reading.clear();
    s->copying = false;
    if (outcome.result) {
      s->failures = 0;
      s->copied_step = std::max(s->copied_step, step);
      s->not_before = {};
    } else {
      outcome.failures_in_a_row = ++s->failures;
      ++s->failed_attempts;
      s->failed_at = Clock::now();
      s->not_before =
          s->failed_at + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(backoff_seconds(s->failures)));
      outcome.retry_in_seconds =
          std::chrono::duration<double>(s->next_attempt() - s->failed_at).count();
      // Retried unless a newer save took its place meanwhile.
      if (!s->pending) s->pending = std::make_pair(folder, step);
    }
    s->done.push_back(std::move(outcome));
    s->changed.notify_all();
  }
}

}  // namespace gpurun

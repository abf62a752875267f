// A call into storage that may hang, waited for a bounded time: on a thread of its own, which
// is left to finish by itself when it takes longer (nothing interrupts a call blocked in a
// network file system that does not answer). Used where the training thread or a stop must
// never wait on such storage: the lease's re-read, the network tier's listing at a stop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace gpurun {

template <class T>
class DetachedCall {
 public:
  /// Starts `f` on a detached thread, which holds the result's state (and whatever `f`
  /// captures: capture copies, never references to objects that may go away first).
  static std::shared_ptr<DetachedCall> start(std::function<T()> f) {
    auto call = std::shared_ptr<DetachedCall>(new DetachedCall);
    std::thread([call, f = std::move(f)] {
      std::optional<T> value;
      std::exception_ptr error;
      try {
        value = f();
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(call->mu_);
      call->value_ = std::move(value);
      call->error_ = error;
      call->done_ = true;
      call->cv_.notify_all();
    }).detach();
    return call;
  }

  /// Waits at most `seconds` (0: not at all) for the call to return; whether it did.
  bool wait_for(double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; });
  }

  /// The result of a call that returned (wait_for() was true); rethrows what it threw.
  T get() {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    return *value_;
  }

 private:
  DetachedCall() = default;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::optional<T> value_;
  std::exception_ptr error_;
};

/// `f()` when it returns within `seconds`, else nullopt (and the call finishes by itself);
/// what it throws is rethrown.
template <class T>
std::optional<T> call_within(double seconds, std::function<T()> f) {
  auto call = DetachedCall<T>::start(std::move(f));
  if (!call->wait_for(seconds)) return std::nullopt;
  return call->get();
}

}  // namespace gpurun

// A hook called around a piece of work: f(true) before it, f(false) after, an exception
// included.
#pragma once

#include <functional>
#include <utility>

namespace gpurun {

/// Calls `f(true)` when made and `f(false)` when destroyed; nothing when `f` is empty.
class Bracket {
 public:
  explicit Bracket(std::function<void(bool)> f) : f_(std::move(f)) {
    if (f_) f_(true);
  }
  ~Bracket() {
    if (f_) f_(false);
  }
  Bracket(const Bracket&) = delete;
  Bracket& operator=(const Bracket&) = delete;

 private:
  std::function<void(bool)> f_;
};

}  // namespace gpurun

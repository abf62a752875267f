#pragma once

#include <chrono>
#include <thread>

#include "gpurun/errors.h"

namespace gpurun::fs {
namespace detail {
void log_retry(const IoError& e, int attempt, int attempts, double delay_seconds);
}

template <typename Op>
auto with_retries(Op&& op, int attempts) -> decltype(op()) {
  double delay = 0.1;
  for (int attempt = 1;; ++attempt) {
    try {
      return op();
    } catch (const IoError& e) {
      if (attempt >= attempts || !is_transient(e.error_number())) throw;
      detail::log_retry(e, attempt, attempts, delay);
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      delay *= 2;
    }
  }
}

}  // namespace gpurun::fs

#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace gpurun {

double learning_rate(const OptimConfig& optim, const ScheduleConfig& s, int64_t step,
                     int64_t total_steps) {
  const double lr = optim.lr;
  if (step < s.warmup_steps) return lr * static_cast<double>(step + 1) / s.warmup_steps;
  if (s.name == "step") return lr * std::pow(s.gamma, static_cast<double>(step / s.step_size));
  if (s.name == "cosine") {
    const int64_t span = std::max<int64_t>(1, total_steps - s.warmup_steps - 1);
    const double t = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
    return s.min_lr + (lr - s.min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
  }
  return lr;
}

}  // namespace gpurun

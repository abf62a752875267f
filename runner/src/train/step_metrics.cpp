#include "train/step_metrics.h"

#include <cstdio>

#include "report/reporter.h"
#include "util/clock.h"

namespace gpurun {

void StepMetrics::start(int64_t global_step, int64_t total_steps) {
  start_ = interval_start_ = step_end_ = Clock::now();
  first_step_ = interval_first_step_ = global_step_ = global_step;
  total_steps_ = total_steps;
}

void StepMetrics::add(int64_t global_step, double loss, int64_t samples) {
  step_end_ = Clock::now();
  step_end_time_ = unix_seconds();
  global_step_ = global_step;
  last_loss_ = loss;
  interval_samples_ += samples;
  interval_loss_ += loss * static_cast<double>(samples);
}

StepMetrics::Interval StepMetrics::close_interval() {
  const double elapsed = std::chrono::duration<double>(step_end_ - interval_start_).count();
  throughput_ = elapsed > 0 ? static_cast<double>(interval_samples_) / elapsed : 0;
  Interval interval;
  interval.mean_loss =
      interval_samples_ > 0 ? interval_loss_ / static_cast<double>(interval_samples_) : 0;
  interval.samples_per_second = throughput_;
  interval.steps = global_step_ - interval_first_step_;
  interval.time = step_end_time_;
  interval_start_ = step_end_;
  interval_first_step_ = global_step_;
  interval_samples_ = 0;
  interval_loss_ = 0;
  return interval;
}

double StepMetrics::eta_seconds() const {
  const int64_t done = global_step_ - first_step_;
  if (done <= 0) return -1;
  return static_cast<double>(total_steps_ - global_step_) *
         std::chrono::duration<double>(step_end_ - start_).count() / static_cast<double>(done);
}

std::string StepMetrics::progress_line(int64_t epoch, int64_t epochs) const {
  double rate = throughput_;
  if (rate <= 0) {
    const double elapsed = seconds_since(interval_start_);
    rate = elapsed > 0 ? static_cast<double>(interval_samples_) / elapsed : 0;
  }
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "epoch %lld/%lld  step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s",
                static_cast<long long>(epoch + 1), static_cast<long long>(epochs),
                static_cast<long long>(global_step_), static_cast<long long>(total_steps_),
                last_loss_.value_or(0.0), rate, format_duration(eta_seconds()).c_str());
  return buf;
}

}  // namespace gpurun

#include "train/step_metrics.h"
#include "util/units.h"

#include <cstdio>

#include "util/clock.h"

namespace gpurun {

namespace {

/// `state[key]` when it is an integer of at least 0 (0 when absent); nullopt otherwise.
std::optional<int64_t> count_in(const nlohmann::json& state, const char* key) {
  if (!state.contains(key)) return 0;
  const nlohmann::json& v = state[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0) return std::nullopt;
  return v.get<int64_t>();
}

}  // namespace

void StepMetrics::start(int64_t global_step, int64_t total_steps) {
  start_ = interval_start_ = step_end_ = Clock::now();
  first_step_ = interval_first_step_ = global_step_ = global_step;
  total_steps_ = total_steps;
}

bool StepMetrics::continue_interval(const nlohmann::json& state) {
  if (!state.is_object() || !state.contains("loss_sum") || !state["loss_sum"].is_number())
    return false;
  const auto since = count_in(state, "since_step"), until = count_in(state, "until_step"),
             samples = count_in(state, "samples"), syncs = count_in(state, "gradient_syncs"),
             calls = count_in(state, "all_reduce_calls"),
             bytes = count_in(state, "all_reduce_bytes");
  if (!since || !until || !samples || !syncs || !calls || !bytes) return false;
  if (*until != global_step_ || global_step_ != first_step_ || *since > *until) return false;
  interval_first_step_ = *since;
  interval_samples_ = *samples;
  interval_loss_ = state["loss_sum"].get<double>();
  // Absent from a checkpoint of a gpurun before the count: the interval then counts from here.
  interval_traffic_ = {*syncs, *calls, *bytes, count_in(state, "moved_bytes").value_or(0)};
  return true;
}

void StepMetrics::add(int64_t global_step, double loss, int64_t samples) {
  step_end_ = Clock::now();
  step_end_time_ = unix_seconds();
  global_step_ = global_step;
  last_loss_ = loss;
  interval_samples_ += samples;
  rate_samples_ += samples;
  interval_loss_ += loss * static_cast<double>(samples);
}

void StepMetrics::add_data_wait(double seconds) {
  wait_seconds_ += seconds;
  ++wait_steps_;
}

void StepMetrics::add_traffic(const SyncTraffic& traffic) {
  interval_traffic_.gradient_syncs += traffic.gradient_syncs;
  interval_traffic_.all_reduce_calls += traffic.all_reduce_calls;
  interval_traffic_.all_reduce_bytes += traffic.all_reduce_bytes;
  interval_traffic_.moved_bytes += traffic.moved_bytes;
}

StepMetrics::Interval StepMetrics::close_interval() {
  const double elapsed = std::chrono::duration<double>(step_end_ - interval_start_).count();
  throughput_ = elapsed > 0 ? static_cast<double>(rate_samples_) / elapsed : 0;
  Interval interval;
  interval.mean_loss =
      interval_samples_ > 0 ? interval_loss_ / static_cast<double>(interval_samples_) : 0;
  interval.samples_per_second = throughput_;
  interval.steps = global_step_ - interval_first_step_;
  interval.time = step_end_time_;
  interval.traffic = interval_traffic_;
  if (wait_steps_ > 0)
    interval.data_wait_seconds = wait_seconds_ / static_cast<double>(wait_steps_);
  wait_seconds_ = 0;
  wait_steps_ = 0;
  interval_start_ = step_end_;
  interval_first_step_ = global_step_;
  interval_samples_ = rate_samples_ = 0;
  interval_loss_ = 0;
  interval_traffic_ = {};
  return interval;
}

nlohmann::json StepMetrics::Interval::event_fields(int world_size) const {
  nlohmann::json fields = {
      {"loss", mean_loss}, {"samples_per_second", samples_per_second}, {"time", time}};
  if (data_wait_seconds >= 0) fields["data_wait_seconds"] = data_wait_seconds;
  if (world_size > 1) {
    const double n = static_cast<double>(steps);
    fields["world_size"] = world_size;
    fields["gradient_syncs_per_step"] = static_cast<double>(traffic.gradient_syncs) / n;
    fields["all_reduce_calls_per_step"] = static_cast<double>(traffic.all_reduce_calls) / n;
    fields["all_reduce_bytes_per_step"] = static_cast<double>(traffic.all_reduce_bytes) / n;
    fields["moved_bytes_per_step"] = static_cast<double>(traffic.moved_bytes) / n;
  }
  return fields;
}

nlohmann::json StepMetrics::interval_state() const {
  return {{"since_step", interval_first_step_},
          {"until_step", global_step_},
          {"loss_sum", interval_loss_},
          {"samples", interval_samples_},
          {"gradient_syncs", interval_traffic_.gradient_syncs},
          {"all_reduce_calls", interval_traffic_.all_reduce_calls},
          {"all_reduce_bytes", interval_traffic_.all_reduce_bytes},
          {"moved_bytes", interval_traffic_.moved_bytes}};
}

double StepMetrics::eta_seconds() const {
  const int64_t done = global_step_ - first_step_;
  if (done <= 0) return -1;
  return static_cast<double>(total_steps_ - global_step_) *
         std::chrono::duration<double>(step_end_ - start_).count() / static_cast<double>(done);
}

std::string StepMetrics::progress_line(int64_t epoch, int64_t epochs, double epoch_loss) const {
  double rate = throughput_;
  if (rate <= 0) {
    const double elapsed = seconds_since(interval_start_);
    rate = elapsed > 0 ? static_cast<double>(rate_samples_) / elapsed : 0;
  }
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "epoch %lld/%lld  step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s",
                static_cast<long long>(epoch + 1), static_cast<long long>(epochs),
                static_cast<long long>(global_step_), static_cast<long long>(total_steps_),
                epoch_loss, rate, format_duration(eta_seconds()).c_str());
  return buf;
}

}  // namespace gpurun

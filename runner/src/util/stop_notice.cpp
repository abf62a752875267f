#include "util/stop_notice.h"

#include <cmath>
#include <csignal>
#include <mutex>

#include <fmt/format.h>

#include "util/clock.h"
#include "util/signals.h"

namespace gpurun {
namespace {
std::mutex g_mutex;
std::optional<StopNotice> g_notice;  ///< guarded by g_mutex
}  // namespace

std::string StopNotice::describe() const {
  return fmt::format("{} {} at {} ({:.0f} s after the notice)", cloud, kind, utc_text(deadline),
                     seconds_left_at_notice());
}

nlohmann::json StopNotice::to_json() const {
  nlohmann::json j = {{"cloud", cloud},
                      {"kind", kind},
                      {"deadline", utc_text(deadline)},
                      {"noticed", utc_text(noticed)},
                      {"seconds_left", std::round(seconds_left_at_notice() * 10) / 10}};
  if (!event_id.empty()) j["event_id"] = event_id;
  return j;
}

void request_stop_for_notice(StopNotice notice) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_notice) g_notice = std::move(notice);
  }
  request_stop(SIGTERM);
}

std::optional<StopNotice> stop_notice() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_notice;
}

void clear_stop_notice() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_notice.reset();
}

}  // namespace gpurun

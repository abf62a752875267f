#include "util/faults.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "util/signals.h"
#include "util/text.h"

namespace gpurun {
namespace {
struct Fault {
  std::string action, point;
  int64_t count = 0;  ///< -1: every occurrence
};

std::vector<Fault> parse_faults() {
  std::vector<Fault> faults;
  const char* spec = std::getenv("GPURUN_FAULT");
  if (!spec) return faults;
  const char* restart = std::getenv("GPURUN_RESTART_COUNT");
  const char* only = std::getenv("GPURUN_FAULT_RESTART");
  const std::string mine = restart ? restart : "0";
  std::istringstream restarts(only ? only : "0");
  bool listed = false;
  for (std::string r; std::getline(restarts, r, ',');) listed = listed || r == mine;
  if (!listed) return faults;
  std::istringstream items(spec);
  for (std::string item; std::getline(items, item, ',');) {
    Fault f;
    auto a = item.find(':'), b = item.rfind(':');
    if (a == std::string::npos || a == b) continue;
    f.action = item.substr(0, a);
    f.point = item.substr(a + 1, b - a - 1);
    f.count = item.substr(b + 1) == "*" ? -1 : std::atoll(item.c_str() + b + 1);
    faults.push_back(f);
  }
  return faults;
}

const std::vector<Fault>& configured_faults() {
  static const std::vector<Fault> faults = parse_faults();
  return faults;
}
}  // namespace

void fault_point(const char* point, int64_t count) {
  const std::vector<Fault>& faults = configured_faults();
  for (const Fault& f : faults) {
    if (f.point != point || (f.count != count && f.count != -1)) continue;
    if (f.action == "hog") continue;  // the trainer's own (fault_fires)
    if (starts_with(f.action, "sleep")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(f.action.c_str() + 5)));
      continue;
    }
    spdlog::warn("test fault: {} at {} {}", f.action, point, count);
    if (f.action == "sigkill") kill(getpid(), SIGKILL);
    if (f.action == "abort") std::abort();
    if (f.action == "exit1") _exit(1);
    if (f.action == "sigterm") request_stop(SIGTERM);
  }
}

bool fault_fires(const char* action, const char* point, int64_t count) {
  for (const Fault& f : configured_faults()) {
    if (f.action != action || f.point != point || (f.count != count && f.count != -1)) continue;
    spdlog::warn("test fault: {} at {} {}", f.action, point, count);
    return true;
  }
  return false;
}

std::optional<double> scripted_eval_loss(int64_t epoch) {
  static const std::vector<double> values = [] {
    std::vector<double> parsed;
    const char* spec = std::getenv("GPURUN_TEST_EVAL_LOSS");
    std::istringstream items(spec ? spec : "");
    for (std::string item; std::getline(items, item, ',');)
      parsed.push_back(std::atof(item.c_str()));
    return parsed;
  }();
  if (epoch < 0 || epoch >= static_cast<int64_t>(values.size())) return std::nullopt;
  spdlog::warn("test hook: epoch {}'s eval_loss is {} (GPURUN_TEST_EVAL_LOSS)", epoch,
               values[epoch]);
  return values[epoch];
}

}  // namespace gpurun

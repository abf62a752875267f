#include "launch/root_cause.h"

#include <sstream>

#include <csignal>
#include <cstring>

#include <spdlog/fmt/fmt.h>

#include "gpurun/errors.h"
#include "util/signals.h"
#include "util/units.h"

namespace gpurun {
namespace {

/// How likely a failure is the root cause, for root_cause_among: higher is likelier.
int severity(const WorkerExit& e) {
  if (e.signal != 0) return 3;
  if (e.exit_code != kExitFailure) return 2;
  return 1;
}

}  // namespace

bool should_restart(const WorkerExit& e) {
  const int c = e.exit_code;
  return e.hung || e.signal != 0 ||
         (c != kExitOk && c != kExitUsage && c != kExitNoResume && c != kExitSignal &&
          c != kExitBudget);
}

std::string describe(const WorkerExit& e) {
  if (e.hung) return "hung: no progress for " + format_seconds(e.stalled_seconds) + " s";
  if (e.signal != 0) {
    // "killed by signal 9 (SIGKILL)"; a number glibc has no name for stands alone.
    return ::sigabbrev_np(e.signal)
               ? fmt::format("killed by signal {} ({})", e.signal, signal_name(e.signal))
               : fmt::format("killed by signal {}", e.signal);
  }
  if (e.exit_code == kExitBudget) return "exited with code 4 (stopped at cost.budget)";
  return fmt::format("exited with code {}", e.exit_code);
}

std::string cause(const WorkerExit& e) {
  std::string out = (e.name.empty() ? "worker" : e.name) + " " + describe(e);
  if (e.step >= 0) out += " at step " + std::to_string(e.step);
  return out;
}

std::string error_line(const WorkerExit& e) {
  static const std::string kPrefix = "gpurun error ";
  std::string found;
  std::istringstream in(e.last_lines);
  for (std::string line; std::getline(in, line);)
    if (const size_t at = line.find(kPrefix); at != std::string::npos)
      found = line.substr(at + kPrefix.size());
  return found;
}

bool repeats(const WorkerExit& now, const WorkerExit& before) {
  if (now.signal != 0 || now.hung || before.signal != 0 || before.hung) return false;
  const std::string error = error_line(now);
  return now.exit_code == before.exit_code && now.step >= 0 && now.step == before.step &&
         !error.empty() && error == error_line(before);
}

std::string kill_hint(const WorkerExit& e) {
  return e.signal == SIGKILL && !e.hung
             ? " (a SIGKILL nobody asked for is often the kernel's OOM killer: see dmesg)"
             : "";
}

std::string last_lines_block(const WorkerExit& e) {
  std::string lines = e.last_lines;
  if (lines.empty()) return " (none)";
  for (size_t at = 0; (at = lines.find('\n', at)) != std::string::npos; at += 5)
    lines.replace(at, 1, "\n  | ");
  return "\n  | " + lines;
}

int root_cause_among(const std::vector<WorkerExit>& exits, const std::vector<int>& ended) {
  int root = -1;
  for (int i : ended) {
    const WorkerExit& e = exits[i];
    if (e.exit_code == kExitOk || (e.exit_code == kExitSignal && e.signal == 0)) continue;
    if (root < 0 || severity(e) > severity(exits[root])) root = i;
  }
  return root;
}

int root_cause_of(const std::vector<WorkerExit>& exits, int first) {
  int root = -1;
  for (size_t i = 0; i < exits.size(); ++i) {
    const WorkerExit& e = exits[i];
    if (e.exit_code == kExitOk || (e.exit_code == kExitSignal && e.signal == 0)) continue;
    // A worker the supervisor killed did not fail of itself; one it asked to stop and that
    // exited with an error of its own (a data error found while it unwound) did.
    if (e.peer_failure || (e.stopped && e.signal != 0)) continue;
    if (root < 0 || e.failed_at < exits[root].failed_at) root = static_cast<int>(i);
  }
  return root >= 0 ? root : first;
}

int outcome_of(const std::vector<WorkerExit>& exits, int root) {
  if (root >= 0) return root;
  for (size_t i = 0; i < exits.size(); ++i)
    if (exits[i].exit_code == kExitSignal || exits[i].signal != 0) return static_cast<int>(i);
  return 0;
}

}  // namespace gpurun

#include "gpurun/errors.h"

#include <cstring>

#include "util/signals.h"

namespace gpurun {

IoError::IoError(const std::string& what, const std::string& path, int err)
    : Error(what + " " + path + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")"),
      path_(path),
      errno_(err) {}

Stopped::Stopped(int signal_number)
    : Error("stopped by " + signal_name(signal_number) + "; run again with --resume"),
      signal_(signal_number) {}

Stopped::Stopped(int signal_number, const std::string& cause)
    : Error("stopped by " + cause + "; run again with --resume"), signal_(signal_number) {}

int exit_code_for(const std::exception& e) noexcept {
  if (dynamic_cast<const ConfigError*>(&e)) return kExitUsage;
  if (dynamic_cast<const ResumeError*>(&e)) return kExitNoResume;
  if (dynamic_cast<const Stopped*>(&e)) return kExitSignal;
  if (dynamic_cast<const BudgetReached*>(&e)) return kExitBudget;
  return kExitFailure;
}

}  // namespace gpurun

#include "util/error_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "util/clock.h"

namespace gpurun {

void leave_error_report(const std::exception& e, int exit_code,
                        const std::string& message) noexcept {
  const char* path = std::getenv(kErrorFileVariable);
  if (!path || !*path) return;
  try {
    const nlohmann::json report = {
        {"time", unix_seconds()},
        {"exit_code", exit_code},
        {"message", message},
        {"peer_failure", dynamic_cast<const PeerFailure*>(&e) != nullptr},
        {"lease_held", dynamic_cast<const LeaseHeld*>(&e) != nullptr}};
    const std::string text =
        report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    for (size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  } catch (...) {
    // The exit code still says what happened.
  }
}

std::optional<ErrorReport> read_error_report(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("time") || !j["time"].is_number()) return std::nullopt;
  try {
    ErrorReport r;
    r.time = j["time"].get<double>();
    r.exit_code = j.value("exit_code", 1);
    r.message = j.value("message", "");
    r.peer_failure = j.value("peer_failure", false);
    r.lease_held = j.value("lease_held", false);
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // a field of another type: not a report of ours
  }
}

}  // namespace gpurun

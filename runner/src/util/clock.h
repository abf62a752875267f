// Time and place as the run's files record them: wall-clock seconds for metrics.jsonl,
// status.json and lease.json, monotonic intervals for stalls and timeouts, and the host name.
#pragma once

#include <chrono>
#include <string>

namespace gpurun {

/// Seconds since the Unix epoch (system clock), as a double with sub-second precision.
double unix_seconds();

/// Seconds elapsed on the monotonic clock since `start`.
double seconds_since(std::chrono::steady_clock::time_point start);

/// `seconds` since the Unix epoch as ISO 8601 UTC to the second, "2026-03-01T12:00:05Z".
std::string utc_text(double seconds);

/// gethostname(2), or "unknown" when it fails.
std::string host_name();

}  // namespace gpurun

// The newest events of a run's metrics.jsonl without reading the whole file: what `gpurun
// status` needs of a run whose status.json is older than its metrics (status.json is written
// at most every 10 s; a run killed outright never writes its last one), and what a resumed run
// compares its first steps with (train/resume_check.h).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpurun {

/// The complete lines among the last `tail_bytes` bytes of `path`, oldest first, without their
/// '\n': a line cut by the window's start or by a kill (no '\n' yet) is left out. Empty when the
/// file is missing, empty or cannot be read. Throws nothing but std::bad_alloc.
std::vector<std::string> complete_lines_in_tail(const std::string& path, size_t tail_bytes);

/// The last complete line of `path` (a metrics.jsonl) whose "event" is `event`, among the lines
/// in its last `tail_bytes` bytes; nullopt when none is there, the file is missing or cannot be
/// read. Lines that do not parse are skipped. Throws nothing.
std::optional<nlohmann::json> last_event_in_tail(const std::string& path, const std::string& event,
                                                 size_t tail_bytes = 256 * 1024);

}  // namespace gpurun

// The newest events of a run's metrics.jsonl without reading the whole file: what `gpurun
// status` needs of a run whose status.json is older than its metrics (status.json is written
// at most every 10 s; a run killed outright never writes its last one).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace gpurun {

/// The last complete line of `path` (a metrics.jsonl) whose "event" is `event`, among the lines
/// in its last `tail_bytes` bytes; nullopt when none is there, the file is missing or cannot be
/// read. A line cut by a kill (no '\n' yet) and lines that do not parse are skipped. Throws
/// nothing.
std::optional<nlohmann::json> last_event_in_tail(const std::string& path, const std::string& event,
                                                 size_t tail_bytes = 256 * 1024);

}  // namespace gpurun

// Byte counts and durations as users write them (--memory-limit, memory.capacity) and as messages
// print them.
#pragma once

#include <cstdint>
#include <string>

namespace gpurun {

/// Parses a SIZE: a byte count ("1000000") or a number with a unit, binary (B, KiB, MiB, GiB,
/// TiB) or decimal (KB, MB, GB, TB), in any case, e.g. "512MiB", "1.5GiB", "2GB", "8gib".
/// Returns bytes.
/// Throws ConfigError for anything else, naming the text and the accepted units.
int64_t parse_size(const std::string& text);

/// Bytes as "512 B", "1.50 KiB", "3.00 MiB" for messages (binary units, two decimals).
std::string format_bytes(int64_t bytes);

/// Seconds for messages: "12", "1.5" (one decimal below 10 s).
std::string format_seconds(double seconds);

/// Seconds as "1h02m", "3m12s", "45s"; "?" for a negative, NaN or absurd duration.
std::string format_duration(double seconds);

}  // namespace gpurun

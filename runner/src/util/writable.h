// Whether files can be created in a directory, proven by creating one: permission bits do not
// say it (root ignores them; a read-only mount, a full disk or a quota still refuse).
#pragma once

#include <string>

namespace gpurun {

/// Creates `dir` when missing, then creates, writes (with fsync) and removes a file in it.
/// Throws IoError naming the operation and path that failed (mkdir, open, write, ...).
void probe_writable(const std::string& dir);

}  // namespace gpurun

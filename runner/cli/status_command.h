// `gpurun status RUN_DIR [--json]`: what a run (live, finished or dead) is doing.
#pragma once

#include <ostream>
#include <string>

namespace gpurun {

/// Reads RUN_DIR/status.json (and the tail of metrics.jsonl) and prints it; with `json` one
/// object. Returns the exit code (2 when RUN_DIR has no status.json).
int status_command(const std::string& run_dir, bool json, std::ostream& out);

}  // namespace gpurun

// `gpurun status RUN_DIR [--json]`: what a run (live, finished or dead) is doing.
#pragma once

#include <ostream>
#include <string>

namespace gpurun {

/// Reads RUN_DIR/status.json (and the tail of metrics.jsonl) and prints it with the state of the
/// run's checkpoints, checked by manifests and sizes, the checksums not read (queue_state.h,
/// check_run_checkpoints(); the line says so); with `json` one object, the check in its
/// "checkpoints": {"checked": "sizes", "dir", "newest", "newest_complete", "ok", "problem"}. A
/// queue directory (RUN_DIR/queue.json, `gpurun queue`) prints the queue and its runs instead
/// (queue_status() in queue/queue_summary.h). Returns the exit code (2 when RUN_DIR has neither).
int status_command(const std::string& run_dir, bool json, std::ostream& out);

}  // namespace gpurun

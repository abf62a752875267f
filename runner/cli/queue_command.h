// `gpurun queue QUEUE.yaml --dir DIR [--parallel N] [--max-restarts N] [--hang-timeout S]`: a
// list of runs trained unattended, back to back or N at a time (queue/queue_runner.h has the
// rules).
#pragma once

#include <ostream>
#include <string>

namespace gpurun {

/// Parses `queue_file` (queue/queue_file.h), then runs it in `dir` with this very binary as
/// each run's gpurun; `hang_timeout` seconds (0: off) as QueueOptions::hang_timeout. Returns
/// the exit code (run_queue()): 0 every run finished, 1 one failed, 75 stopped by a signal.
/// Throws ConfigError (exit 2) for a bad queue file or options, or `dir` held by a live queue,
/// before any run starts.
int queue_command(const std::string& queue_file, const std::string& dir, int parallel,
                  int max_restarts, double hang_timeout, std::ostream& out);

}  // namespace gpurun

// A run directory read back for `gpurun report` (docs/architecture.md, "Run directory"):
// metrics.jsonl up to its last complete line, status.json and the resolved config.json. The run
// may be finished, dead or still writing: a line without its '\n' is one being written (or cut
// by a kill) and is left out, never guessed at.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpurun {

struct RunHistory {
  std::string dir;
  std::vector<nlohmann::json> events;     ///< metrics.jsonl's complete lines that parse, in order
  int64_t complete_lines = 0;             ///< lines ending in '\n'
  std::vector<int64_t> unreadable_lines;  ///< 1-based numbers of complete lines that do not parse
  bool incomplete_tail = false;           ///< the file ends in a line without '\n' (left out)
  nlohmann::json status;                  ///< status.json; null when missing or not JSON
  nlohmann::json config;                  ///< config.json, the resolved config; null when missing
};

/// Reads RUN_DIR. Throws ConfigError naming the problem when `dir` does not exist or is not a
/// directory, has no metrics.jsonl, or its metrics.jsonl holds no complete event yet (empty, or
/// a first line still being written). Throws IoError when a file exists but cannot be read.
RunHistory read_run_history(const std::string& dir);

}  // namespace gpurun

#include "view/run_history.h"

#include <sys/stat.h>

#include "gpurun/errors.h"
#include "util/fs.h"

namespace gpurun {
namespace {

/// The JSON object in `path`; null when the file is missing or does not parse.
nlohmann::json read_json_file(const std::string& path) {
  if (!fs::exists(path)) return nullptr;
  nlohmann::json j = nlohmann::json::parse(fs::read_file(path), nullptr, false);
  return j.is_discarded() ? nlohmann::json() : j;
}

}  // namespace

RunHistory read_run_history(const std::string& dir) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0)
    throw ConfigError("no such directory: " + dir +
                      " (give a run directory: the --ckpt or "
                      "--run-dir of `gpurun run`, or a `gpurun queue` --dir)");
  if (!S_ISDIR(st.st_mode)) throw ConfigError(dir + " is not a directory");
  RunHistory run;
  run.dir = dir;
  const std::string path = dir + "/metrics.jsonl";
  if (!fs::exists(path))
    throw ConfigError("no metrics.jsonl in " + dir +
                      ": not a run directory, or its run wrote "
                      "its metrics elsewhere (--run-dir)");
  struct stat file {};
  if (stat(path.c_str(), &file) == 0 && !S_ISREG(file.st_mode))
    throw ConfigError(path + " is not a file");
  const std::string text = fs::read_file(path);
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) {
      run.incomplete_tail = true;
      break;
    }
    ++run.complete_lines;
    nlohmann::json line =
        nlohmann::json::parse(text.begin() + static_cast<std::ptrdiff_t>(begin),
                              text.begin() + static_cast<std::ptrdiff_t>(end), nullptr, false);
    if (line.is_object() && line.contains("event") && line["event"].is_string())
      run.events.push_back(std::move(line));
    else if (end > begin)
      run.unreadable_lines.push_back(run.complete_lines);
    begin = end + 1;
  }
  if (run.events.empty() && run.complete_lines > 0)
    throw ConfigError(path + ": none of its " + std::to_string(run.complete_lines) +
                      " lines is a metrics event (one JSON object with \"event\" a line): "
                      "not gpurun's metrics, or damaged");
  if (run.events.empty())
    throw ConfigError(path + (text.empty() ? " is empty" : " holds no complete event yet") +
                      ": the run has not logged anything (its first line is written when "
                      "training starts); try again in a moment");
  run.status = read_json_file(dir + "/status.json");
  run.config = read_json_file(dir + "/config.json");
  return run;
}

}  // namespace gpurun

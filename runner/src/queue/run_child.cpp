#include "queue/run_child.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include <yaml-cpp/yaml.h>

#include "gpurun/errors.h"
#include "queue/queue_state.h"
#include "util/fs.h"
#include "util/signals.h"
#include "util/text.h"

namespace gpurun {

/// The CPUs this process may run on (its affinity mask: a container's or Slurm's cpuset), else
/// hardware_concurrency(); at least 1.
unsigned usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return static_cast<unsigned>(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

bool has_set(const std::vector<std::string>& sets, const std::string& key) {
  for (const std::string& s : sets)
    if (starts_with(s, key + "=")) return true;
  return false;
}

/// Whether the config file sets train.threads itself (then the queue leaves it alone).
bool config_sets_threads(const std::string& config) {
  try {
    const YAML::Node root = YAML::LoadFile(config);
    return root.IsMap() && root["train"] && root["train"].IsMap() && root["train"]["threads"];
  } catch (const std::exception&) {
    return false;  // the run's own gpurun reports a config that does not parse
  }
}

/// The last "gpurun error ..." line of a run's stderr.log (else its last line), for the report.
std::string last_error_line(const std::string& path) {
  std::string text;
  try {
    text = fs::read_file(path);
  } catch (const IoError&) {
    return "";
  }
  if (text.size() > 16384) text = text.substr(text.size() - 16384);
  std::string last, error;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find_first_of("\r\n", start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    if (!line.empty()) {
      last = line;
      if (line.find("gpurun error") != std::string::npos) error = line;
    }
    start = end + 1;
  }
  std::string out = error.empty() ? last : error;
  // Colour codes of spdlog's terminal sink, if any.
  std::string clean;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == '\x1b') {
      while (i < out.size() && out[i] != 'm') ++i;
      continue;
    }
    clean += out[i];
  }
  return clean.substr(0, 500);
}

std::string describe_exit(int exit_code, int signal) {
  if (signal != 0) return "was killed by " + signal_name(signal);
  switch (exit_code) {
    case kExitUsage:
      return "exited 2 (usage or config error, not retried)";
    case kExitNoResume:
      return "exited 3 (cannot resume, not retried)";
    case 127:
      return "exited 127 (the gpurun binary could not be executed)";
    default:
      return "exited " + std::to_string(exit_code);
  }
}

std::vector<std::string> cuda_devices(const std::map<std::string, std::string>& env,
                                      const std::string& dev_dir) {
  std::vector<std::string> out;
  const auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it != env.end()) {
    const std::string& v = it->second;
    size_t start = 0;
    while (start <= v.size()) {
      size_t end = v.find(',', start);
      if (end == std::string::npos) end = v.size();
      std::string entry = v.substr(start, end - start);
      entry.erase(0, entry.find_first_not_of(' '));
      entry.erase(entry.find_last_not_of(' ') + 1);
      if (entry.empty() || entry == "-1") break;  // CUDA ignores what follows an invalid one
      out.push_back(entry);
      start = end + 1;
    }
    return out;
  }
  std::vector<int> numbers;
  for (const std::string& name : fs::list_dir(dev_dir)) {
    if (name.size() <= 6 || !starts_with(name, "nvidia")) continue;
    const std::string digits = name.substr(6);
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 4) continue;
    numbers.push_back(std::stoi(digits));
  }
  std::sort(numbers.begin(), numbers.end());
  for (int n : numbers) out.push_back(std::to_string(n));
  return out;
}

std::vector<std::string> run_argv(const std::string& binary, const std::string& dir,
                                  const std::string& name, const std::string& config,
                                  const std::vector<std::string>& sets) {
  std::vector<std::string> argv{binary, "run", config, "--ckpt", run_dir_of(dir, name), "--resume"};
  for (const std::string& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  return argv;
}

}  // namespace gpurun

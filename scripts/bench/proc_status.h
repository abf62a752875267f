// What /proc/self/status says of this process's memory, for the benches that measure the host
// memory a save or an upload holds (VmRSS now, VmHWM its peak).
#pragma once

#include <fstream>
#include <string>

namespace gpurun::bench {

/// VmRSS or VmHWM of this process, in bytes; -1 when /proc/self/status lacks it.
inline long long status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return -1;
}

}  // namespace gpurun::bench

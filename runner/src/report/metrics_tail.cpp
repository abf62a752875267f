#include "report/metrics_tail.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "gpurun/errors.h"
#include "util/fd_io.h"

namespace gpurun {

std::vector<std::string> complete_lines_in_tail(const std::string& path, size_t tail_bytes) {
  std::vector<std::string> lines;
  // A FIFO (or a device) in place of metrics.jsonl would block open(2) for good: only a
  // regular file is read, and the open itself never waits for a writer.
  struct stat before {};
  if (::stat(path.c_str(), &before) != 0 || !S_ISREG(before.st_mode)) return lines;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return lines;
  struct stat st {};
  std::string text;
  off_t from = 0;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    const off_t size = st.st_size;
    from = size > static_cast<off_t>(tail_bytes) ? size - static_cast<off_t>(tail_bytes) : 0;
    text.resize(static_cast<size_t>(size - from));
    try {
      text.resize(fs::pread_full(fd, text.data(), text.size(), from, path));
    } catch (const IoError&) {
      text.clear();
    }
  }
  ::close(fd);
  // The first line may be cut by the window: it starts after the first newline.
  size_t begin = 0;
  if (from > 0) {
    const size_t first = text.find('\n');
    begin = first == std::string::npos ? text.size() : first + 1;
  }
  // Only complete lines: a line without its '\n' is being written or was cut by a kill.
  for (size_t end = text.find('\n', begin); end != std::string::npos;
       begin = end + 1, end = text.find('\n', begin))
    lines.push_back(text.substr(begin, end - begin));
  return lines;
}

std::optional<nlohmann::json> last_event_in_tail(const std::string& path, const std::string& event,
                                                 size_t tail_bytes) {
  try {
    const std::vector<std::string> lines = complete_lines_in_tail(path, tail_bytes);
    for (auto line = lines.rbegin(); line != lines.rend(); ++line) {
      if (line->find("\"" + event + "\"") == std::string::npos) continue;
      nlohmann::json j = nlohmann::json::parse(*line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.value("event", "") == event) return j;
    }
  } catch (const std::exception&) {  // out of memory, an "event" that is not a string
  }
  return std::nullopt;
}

}  // namespace gpurun

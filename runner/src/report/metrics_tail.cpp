#include "report/metrics_tail.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace gpurun {

std::optional<nlohmann::json> last_event_in_tail(const std::string& path, const std::string& event,
                                                 size_t tail_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    const off_t size = st.st_size;
    const off_t from =
        size > static_cast<off_t>(tail_bytes) ? size - static_cast<off_t>(tail_bytes) : 0;
    text.resize(static_cast<size_t>(size - from));
    size_t used = 0;
    while (used < text.size()) {
      const ssize_t n =
          ::pread(fd, text.data() + used, text.size() - used, from + static_cast<off_t>(used));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      used += static_cast<size_t>(n);
    }
    text.resize(used);
    // The first line may be cut by the window: it starts after the first newline.
    if (from > 0) {
      const size_t first = text.find('\n');
      text.erase(0, first == std::string::npos ? text.size() : first + 1);
    }
  }
  ::close(fd);
  // Only complete lines: a line without its '\n' is being written or was cut by a kill.
  size_t end = text.rfind('\n');
  while (end != std::string::npos && end > 0) {
    const size_t start = text.rfind('\n', end - 1);
    const size_t begin = start == std::string::npos ? 0 : start + 1;
    const std::string line = text.substr(begin, end - begin);
    if (line.find("\"" + event + "\"") != std::string::npos) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.value("event", "") == event) return j;
    }
    if (start == std::string::npos) break;
    end = start;
  }
  return std::nullopt;
}

}  // namespace gpurun

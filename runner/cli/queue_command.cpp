#include "cli/queue_command.h"

#include <filesystem>

#include "queue/queue_file.h"
#include "queue/queue_runner.h"

namespace gpurun {

int queue_command(const std::string& queue_file, const std::string& dir, int parallel,
                  int max_restarts, double hang_timeout, std::ostream& out) {
  const QueueFile queue = load_queue_file(queue_file);
  QueueOptions options;
  options.dir = dir;
  options.parallel = parallel;
  options.max_restarts = max_restarts;
  options.hang_timeout = hang_timeout;
  // Each run is this very binary, by its resolved path, so that `ps` shows what runs.
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  options.binary = ec ? "/proc/self/exe" : self.string();
  return run_queue(queue, options, out);
}

}  // namespace gpurun

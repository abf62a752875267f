// DIR/queue.lock of `gpurun queue` (docs/architecture.md, "Queue directory"): one live queue
// per directory. No Torch headers.
#pragma once

#include <string>

namespace gpurun {

/// flock(2) of DIR/queue.lock, held while this object lives; the kernel drops it when the
/// process dies, however (SIGKILL included), so a lock is never stale. The file is opened
/// close-on-exec: no child, nor an orphan that outlives the queue, holds it. Its text names
/// the holder ("pid N on HOST"). Throws ConfigError (exit 2) naming the holder while another
/// live queue holds it; IoError when the file cannot be opened. A file system without locks
/// (ENOLCK, EOPNOTSUPP: NFSv3 without lockd) is warned about and not refused.
class QueueLock {
 public:
  explicit QueueLock(const std::string& dir);
  ~QueueLock();
  QueueLock(const QueueLock&) = delete;
  QueueLock& operator=(const QueueLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace gpurun

#include "queue/queue_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "gpurun/errors.h"
#include "util/clock.h"
#include "util/fs.h"

namespace gpurun {

QueueLock::QueueLock(const std::string& dir) : path_(dir + "/queue.lock") {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError("open", path_, errno);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
      // A network file system without locks (NFSv3 without lockd): the queue still runs,
      // and each run's checkpoint lease still keeps two writers out of its directory.
      spdlog::warn(
          "queue: {} cannot be locked ({}): a second queue on this directory would "
          "not be refused",
          path_, std::strerror(err));
      return;
    }
    ::close(fd_);
    if (err != EWOULDBLOCK) throw IoError("flock", path_, err);
    std::string holder;
    try {
      holder = fs::read_file(path_);
    } catch (const IoError&) {
    }
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    throw ConfigError(dir + " is used by a live gpurun queue (" +
                      (holder.empty() ? std::string("holder unknown") : holder) +
                      "): wait for it to end, or stop it (SIGTERM) and run this again");
  }
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host_name() + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t ignored = ::pwrite(fd_, me.data(), me.size(), 0);
    (void)ignored;  // the lock is what counts; the text only names the holder
  }
}

QueueLock::~QueueLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace gpurun

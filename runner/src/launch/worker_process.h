// One worker process of the supervisor (supervisor.h): started with fork + execve in its own
// process group, its stderr read through a pipe by a thread, and its heartbeat file watched.
// POSIX only; no Torch headers.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace gpurun {

/// Reads a child's stderr from a pipe in a thread, echoes it to ours as it comes and keeps the
/// last 20 lines ('\r' ends a line too, so that in-place progress lines stay short; a line is
/// cut at 1000 characters).
class StderrTap {
 public:
  /// Takes ownership of `fd`, the read end of the pipe. `echo`: copy what comes to our stderr
  /// (the first worker only; the others log to files).
  StderrTap(int fd, bool echo);
  ~StderrTap();
  StderrTap(const StderrTap&) = delete;
  StderrTap& operator=(const StderrTap&) = delete;

  /// Call once the child is reaped: reads what is left, stopping at EOF, when the pipe stays
  /// empty for one poll interval (50 ms), or after 1 s (a grandchild that outlived the child
  /// may hold the pipe open). Returns the kept lines, '\n'-separated.
  std::string finish();

 private:
  void read_loop();
  void push_line();

  int fd_;
  bool echo_;
  std::atomic<bool> child_gone_{false};
  std::deque<std::string> lines_;  // touched by the thread only, read after join
  std::string partial_;
  std::thread thread_;  // last, so that it starts after the members it uses
};

/// A started child.
struct Child {
  pid_t pid = -1;
  int stderr_fd = -1;  ///< the read end of the child's stderr pipe
  int exec_errno = 0;  ///< execve's errno when it failed (the child has then exited 127)
};

/// fork + execve of `argv` (argv[0] a path: no PATH search) with `env` (KEY=VALUE) into a new
/// process group, stderr into a pipe, signals unblocked, and PR_SET_PDEATHSIG(SIGTERM) on
/// Linux (a supervisor killed outright still makes its child save and exit). Returns once
/// execve succeeded or failed (told through a close-on-exec pipe). Throws IoError when pipe2
/// or fork fails.
Child spawn(std::vector<std::string> argv, std::vector<std::string> env);

/// As spawn(), but the child's stdout and stderr go to the open files `stdout_fd` and
/// `stderr_fd` (they stay the caller's to close; open them O_APPEND | O_CLOEXEC) instead of a
/// pipe: Child::stderr_fd is -1 and no StderrTap is needed (`gpurun queue`'s runs log to
/// files). Throws std::invalid_argument for a negative fd, IoError as spawn().
Child spawn_to_files(std::vector<std::string> argv, std::vector<std::string> env, int stdout_fd,
                     int stderr_fd);

/// Runs `argv` (argv[0] looked up in PATH) with our environment, stderr on /dev/null, and
/// returns what it wrote to stdout when it exits 0 within `timeout_seconds`; nullopt when it
/// is not found, fails, or is still running then (it is SIGKILLed). For asking a scheduler's
/// command (scontrol) a question; never throws.
std::optional<std::string> command_output(std::vector<std::string> argv, double timeout_seconds);

/// Set by `gpurun queue` in its runs' environment (to its DIR): such a run leaves
/// cost.stop_command to the queue, which has other runs to train after it.
inline constexpr const char* kQueueVariable = "GPURUN_QUEUE";

/// Our environment with `extra`, then `worker`'s variables over it, and
/// GPURUN_RESTART_COUNT=`restart`, as KEY=VALUE strings.
std::vector<std::string> child_environment(const std::map<std::string, std::string>& extra,
                                           const std::map<std::string, std::string>& worker,
                                           int restart);

/// A heartbeat file's existence, mtime (s, ns) and size: a change of any is progress. All
/// zero for an empty path or a file that cannot be stat'ed.
using HeartbeatKey = std::tuple<bool, int64_t, int64_t, int64_t>;
HeartbeatKey heartbeat_key(const std::string& path);

}  // namespace gpurun

#include "launch/worker_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <stdexcept>
#include <utility>

#include "distributed/worker_env.h"
#include "gpurun/errors.h"

namespace gpurun {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::milliseconds(50);
constexpr size_t kKeptLines = 20;
constexpr size_t kMaxLineChars = 1000;
constexpr auto kDrainLimit = std::chrono::seconds(1);

void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // our stderr is gone; keep reading so the child never blocks
    data += w;
    n -= static_cast<size_t>(w);
  }
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

StderrTap::StderrTap(int fd, bool echo) : fd_(fd), echo_(echo), thread_([this] { read_loop(); }) {}

StderrTap::~StderrTap() { finish(); }

std::string StderrTap::finish() {
  child_gone_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!partial_.empty()) push_line();
  std::string out;
  for (const std::string& line : lines_) out += (out.empty() ? "" : "\n") + line;
  return out;
}

void StderrTap::read_loop() {
  char buf[4096];
  bool draining = false;
  Clock::time_point drain_end{};
  while (true) {
    if (!draining && child_gone_) {
      draining = true;
      drain_end = Clock::now() + kDrainLimit;
    }
    if (draining && Clock::now() >= drain_end) return;
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(kPollInterval.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || (ready == 0 && draining)) return;
    if (ready == 0) continue;
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // EOF: every writer is gone
    if (echo_) write_all(STDERR_FILENO, buf, static_cast<size_t>(n));
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == '\n' || buf[i] == '\r') {
        if (!partial_.empty()) push_line();
      } else if (partial_.size() < kMaxLineChars) {
        partial_ += buf[i];
      }
    }
  }
}

void StderrTap::push_line() {
  lines_.push_back(std::move(partial_));
  partial_.clear();
  if (lines_.size() > kKeptLines) lines_.pop_front();
}

HeartbeatKey heartbeat_key(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return {false, 0, 0, 0};
  return {true, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_size};
}

std::vector<std::string> child_environment(const std::map<std::string, std::string>& extra,
                                           const std::map<std::string, std::string>& worker,
                                           int restart) {
  Environment env = current_environment();
  for (const auto& [key, value] : extra) env[key] = value;
  for (const auto& [key, value] : worker) env[key] = value;
  env["GPURUN_RESTART_COUNT"] = std::to_string(restart);
  std::vector<std::string> out;
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

namespace {

/// spawn() and spawn_to_files(): `stderr_fd` < 0 pipes the child's stderr to us.
Child spawn_child(std::vector<std::string>& argv, std::vector<std::string>& env, int stdout_fd,
                  int stderr_fd) {
  // Everything the child needs is allocated before fork: after it, only async-signal-safe calls.
  std::vector<char*> c_argv = c_strings(argv), c_env = c_strings(env);
  int err_pipe[2] = {-1, -1}, status_pipe[2];
  if (stderr_fd < 0 && ::pipe2(err_pipe, O_CLOEXEC) != 0) throw IoError("pipe", argv[0], errno);
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    if (err_pipe[0] >= 0) ::close(err_pipe[0]);
    if (err_pipe[1] >= 0) ::close(err_pipe[1]);
    throw IoError("pipe", argv[0], err);
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);  // a terminal's Ctrl-C reaches the child only through our forwarding
#ifdef __linux__
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // a supervisor killed outright: save and exit
    if (::getppid() != parent) ::_exit(kExitSignal);
#else
    (void)parent;
#endif
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (stdout_fd >= 0) ::dup2(stdout_fd, STDOUT_FILENO);
    ::dup2(stderr_fd >= 0 ? stderr_fd : err_pipe[1], STDERR_FILENO);
    ::execve(c_argv[0], c_argv.data(), c_env.data());
    const int err = errno;
    const ssize_t ignored = ::write(status_pipe[1], &err, sizeof err);
    (void)ignored;
    ::_exit(127);
  }
  const int fork_errno = errno;
  if (err_pipe[1] >= 0) ::close(err_pipe[1]);
  ::close(status_pipe[1]);
  if (pid < 0) {
    if (err_pipe[0] >= 0) ::close(err_pipe[0]);
    ::close(status_pipe[0]);
    throw IoError("fork", argv[0], fork_errno);
  }
  ::setpgid(pid, pid);  // here too, so the group exists before we could signal it
  Child child{pid, err_pipe[0], 0};
  int err = 0;
  ssize_t n;
  do n = ::read(status_pipe[0], &err, sizeof err);
  while (n < 0 && errno == EINTR);
  ::close(status_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof err)) child.exec_errno = err;
  return child;
}

}  // namespace

Child spawn(std::vector<std::string> argv, std::vector<std::string> env) {
  return spawn_child(argv, env, -1, -1);
}

Child spawn_to_files(std::vector<std::string> argv, std::vector<std::string> env, int stdout_fd,
                     int stderr_fd) {
  if (stdout_fd < 0 || stderr_fd < 0)
    throw std::invalid_argument("spawn_to_files: stdout_fd and stderr_fd must be open files");
  return spawn_child(argv, env, stdout_fd, stderr_fd);
}

std::optional<std::string> command_output(std::vector<std::string> argv, double timeout_seconds) {
  if (argv.empty()) return std::nullopt;
  if (argv[0].find('/') == std::string::npos) {
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/bin:/bin";
    std::string found;
    for (size_t at = 0; at <= dirs.size();) {
      size_t end = dirs.find(':', at);
      if (end == std::string::npos) end = dirs.size();
      const std::string candidate = dirs.substr(at, end - at) + "/" + argv[0];
      if (end > at && ::access(candidate.c_str(), X_OK) == 0) {
        found = candidate;
        break;
      }
      at = end + 1;
    }
    if (found.empty()) return std::nullopt;
    argv[0] = found;
  }
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null_fd < 0) return std::nullopt;
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(null_fd);
    return std::nullopt;
  }
  std::vector<std::string> env;
  for (const auto& [key, value] : current_environment()) env.push_back(key + "=" + value);
  Child child{};
  try {
    child = spawn_child(argv, env, out[1], null_fd);
  } catch (const std::exception&) {
    child.pid = -1;
  }
  ::close(out[1]);
  ::close(null_fd);
  std::string text;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_seconds);
  bool timed_out = child.pid <= 0;
  while (!timed_out) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  if (child.pid <= 0) return std::nullopt;
  if (timed_out) ::kill(-child.pid, SIGKILL);
  int status = 0;
  while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out || child.exec_errno != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return std::nullopt;
  return text;
}

}  // namespace gpurun

#include "gpurun/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include <spdlog/spdlog.h>

#include "gpurun/errors.h"
#include "gpurun/signals.h"

extern char** environ;

namespace gpurun {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::milliseconds(50);
constexpr size_t kKeptLines = 20;
constexpr size_t kMaxLineChars = 1000;
constexpr auto kDrainLimit = std::chrono::seconds(1);

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string format_seconds(double s) {
  return s >= 10 ? fmt::format("{:.0f}", s) : fmt::format("{:.1f}", s);
}

/// "SIGKILL"; "signal 64" for a number glibc has no name for.
std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);  // glibc >= 2.32, as in errors.cpp
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // our stderr is gone; keep reading so the child never blocks
    data += w;
    n -= static_cast<size_t>(w);
  }
}

/// Lines for a log message: "\n  | line" each, or " (none)".
std::string indent_lines(std::string lines) {
  if (lines.empty()) return " (none)";
  for (size_t at = 0; (at = lines.find('\n', at)) != std::string::npos; at += 5)
    lines.replace(at, 1, "\n  | ");
  return "\n  | " + lines;
}

/// Reads the child's stderr from a pipe in a thread, echoes it to ours as it comes and keeps the
/// last kKeptLines lines ('\r' ends a line too, so in-place progress lines stay short).
class StderrTap {
 public:
  explicit StderrTap(int fd) : fd_(fd), thread_([this] { read_loop(); }) {}
  ~StderrTap() { finish(); }

  /// Call once the child is reaped: reads what is left, stopping at EOF, when the pipe stays
  /// empty for one poll interval, or after kDrainLimit (a grandchild that outlived the child may
  /// hold the pipe open). Returns the kept lines, '\n'-separated.
  std::string finish() {
    child_gone_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!partial_.empty()) push_line();
    std::string out;
    for (const std::string& line : lines_) out += (out.empty() ? "" : "\n") + line;
    return out;
  }

 private:
  void read_loop() {
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
      write_all(STDERR_FILENO, buf, static_cast<size_t>(n));
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] == '\n' || buf[i] == '\r') {
          if (!partial_.empty()) push_line();
        } else if (partial_.size() < kMaxLineChars) {
          partial_ += buf[i];
        }
      }
    }
  }

  void push_line() {
    lines_.push_back(std::move(partial_));
    partial_.clear();
    if (lines_.size() > kKeptLines) lines_.pop_front();
  }

  int fd_;
  std::atomic<bool> child_gone_{false};
  std::deque<std::string> lines_;  // touched by the thread only, read after join
  std::string partial_;
  std::thread thread_;  // last, so that it starts after the members it uses
};

/// The heartbeat file's existence, mtime (s, ns) and size: a change of any is progress.
using HeartbeatKey = std::tuple<bool, int64_t, int64_t, int64_t>;
HeartbeatKey heartbeat_key(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return {false, 0, 0, 0};
  return {true, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_size};
}

std::vector<std::string> child_environment(const SupervisorOptions& o, int restart) {
  std::map<std::string, std::string> extra = o.env;
  extra["GPURUN_RESTART_COUNT"] = std::to_string(restart);
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv(*e);
    if (extra.count(std::string(kv.substr(0, kv.find('=')))) == 0) out.emplace_back(kv);
  }
  for (const auto& [key, value] : extra) out.push_back(key + "=" + value);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

struct Child {
  pid_t pid = -1;
  int stderr_fd = -1;  // the read end of the child's stderr pipe
  int exec_errno = 0;  // execve's errno when it failed (the child has then exited 127)
};

/// fork + execve into a new process group, stderr into a pipe. Returns once execve succeeded or
/// failed (told through a close-on-exec pipe). Throws IoError when pipe2 or fork fails.
Child spawn(std::vector<std::string> argv, std::vector<std::string> env) {
  // Everything the child needs is allocated before fork: after it, only async-signal-safe calls.
  std::vector<char*> c_argv = c_strings(argv), c_env = c_strings(env);
  int err_pipe[2], status_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw IoError("pipe", argv[0], errno);
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
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
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::execve(c_argv[0], c_argv.data(), c_env.data());
    const int err = errno;
    const ssize_t ignored = ::write(status_pipe[1], &err, sizeof err);
    (void)ignored;
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(err_pipe[1]);
  ::close(status_pipe[1]);
  if (pid < 0) {
    ::close(err_pipe[0]);
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

/// One run of the child and how it ended.
struct Attempt {
  WorkerExit exit;
  int forwarded = 0;        // the stop signal we received and forwarded, 0 when none
  bool progressed = false;  // the heartbeat changed during the run
  int exec_errno = 0;       // execve failed: nothing ran
};

class Supervisor {
 public:
  explicit Supervisor(const SupervisorOptions& options) : options_(options) {}

  int run() {
    int restart = 0;
    int failures_without_progress = 0;
    std::string history;
    while (true) {
      if (const int sig = stop_signal(); sig != 0) {
        spdlog::warn("{} received; not starting the worker", signal_name(sig));
        return kExitSignal;
      }
      const Attempt a = run_once(restart);
      if (a.exec_errno != 0) {
        spdlog::error("cannot execute {}: {}; not retried", options_.argv[0],
                      std::strerror(a.exec_errno));
        return kExitFailure;
      }
      const WorkerExit& e = a.exit;
      if (options_.on_worker_exit) options_.on_worker_exit(e);
      if (!should_restart(e)) return final_code(e);
      if (a.forwarded != 0 || stop_signal() != 0) {
        spdlog::warn("worker {} after a stop signal; not restarting it", describe(e));
        return e.signal != 0 ? kExitSignal : e.exit_code;  // a signal ends in 75, never 143
      }
      history += fmt::format("{}run {}: {} after {} s", history.empty() ? "" : "; ", restart,
                             describe(e), format_seconds(e.seconds));
      const std::string hint = e.signal == SIGKILL && !e.hung
                                   ? " (a SIGKILL nobody asked for is often the kernel's OOM "
                                     "killer: see dmesg)"
                                   : "";
      if (restart >= options_.max_restarts) {
        spdlog::error(
            "worker {}{} at restart {}/{}; no restarts left, giving up ({}); last lines "
            "of its stderr:{}",
            describe(e), hint, restart, options_.max_restarts, history, indent_lines(e.last_lines));
        return kExitFailure;
      }
      failures_without_progress = a.progressed ? 1 : failures_without_progress + 1;
      const double delay =
          std::min(options_.backoff_max,
                   options_.backoff_initial * std::pow(2.0, failures_without_progress - 1));
      spdlog::warn("worker {}{} at restart {}/{}; restarting in {} s; last lines of its stderr:{}",
                   describe(e), hint, restart, options_.max_restarts, format_seconds(delay),
                   indent_lines(e.last_lines));
      if (!sleep_unless_stopped(delay)) {
        spdlog::warn("{} received during the backoff; not restarting the worker",
                     signal_name(stop_signal()));
        return kExitSignal;
      }
      ++restart;
    }
  }

 private:
  /// The code for an exit that is not retried (0, 2, 3, 75), logged with its meaning.
  static int final_code(const WorkerExit& e) {
    if (e.exit_code == kExitUsage || e.exit_code == kExitNoResume) {
      spdlog::error("worker {} ({}); not retried", describe(e),
                    e.exit_code == kExitUsage ? "usage or config error" : "cannot resume");
    } else if (e.exit_code == kExitSignal) {
      spdlog::warn("worker {} (stopped by a signal); not restarting it", describe(e));
    }
    return e.exit_code;
  }

  void set_state(WorkerState to, pid_t pid, const std::string& detail) {
    spdlog::info("worker{}: {} -> {}{}", pid > 0 ? fmt::format(" pid {}", pid) : "",
                 state_name(state_), state_name(to), detail);
    state_ = to;
  }

  Attempt run_once(int restart) {
    Attempt a;
    state_ = WorkerState::kStarting;
    std::string command;
    for (const std::string& arg : options_.argv) command += (command.empty() ? "" : " ") + arg;
    spdlog::info("worker: starting (restart {}/{}): {}", restart, options_.max_restarts, command);
    // Progress is a change of the heartbeat seen during this run, timed by our steady clock: a
    // file left by an earlier run does not count, and neither does a file server's clock.
    HeartbeatKey beat = heartbeat_key(options_.progress_file);
    const auto start = Clock::now();
    auto last_progress = start;
    const Child child = spawn(options_.argv, child_environment(options_, restart));
    StderrTap tap(child.stderr_fd);
    int status = 0;
    if (child.exec_errno != 0) {
      while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
      }
      a.exec_errno = child.exec_errno;
      set_state(WorkerState::kFailed, child.pid, ": execve failed");
      return a;
    }
    set_state(WorkerState::kRunning, child.pid, "");
    while (true) {
      const pid_t r = ::waitpid(child.pid, &status, WNOHANG);
      if (r == child.pid) break;
      if (r < 0 && errno != EINTR) throw IoError("waitpid", options_.argv[0], errno);
      if (const int sig = stop_signal(); sig != 0 && a.forwarded == 0) {
        // SIGINT goes on as SIGTERM: where a scheduler signals every process of the job, the
        // child would otherwise see two SIGINTs, which means "stop now, without saving".
        const int forward = sig == SIGINT ? SIGTERM : sig;
        spdlog::warn("{} received; forwarding {} to worker pid {} and waiting for it",
                     signal_name(sig), signal_name(forward), child.pid);
        ::kill(child.pid, forward);
        a.forwarded = sig;
      }
      if (const HeartbeatKey now = heartbeat_key(options_.progress_file); now != beat) {
        beat = now;
        last_progress = Clock::now();
        a.progressed = true;
      }
      const double stalled = seconds_since(last_progress);
      if (options_.hang_timeout > 0 && !a.exit.hung && stalled >= options_.hang_timeout) {
        spdlog::error(
            "worker pid {} made no progress for {} s ({} unchanged); killing its "
            "process group with SIGKILL",
            child.pid, format_seconds(stalled), options_.progress_file);
        ::kill(-child.pid, SIGKILL);
        a.exit.hung = true;
        a.exit.stalled_seconds = stalled;
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    a.exit.seconds = seconds_since(start);
    if (heartbeat_key(options_.progress_file) != beat) a.progressed = true;  // a last beat
    if (WIFEXITED(status)) a.exit.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) a.exit.signal = WTERMSIG(status);
    // Processes the worker left in its group (its own workers) would hold memory and ports.
    if (!a.exit.hung && ::kill(-child.pid, 0) == 0) {
      spdlog::warn("killing the processes worker pid {} left in its process group", child.pid);
      ::kill(-child.pid, SIGKILL);
    }
    a.exit.last_lines = tap.finish();
    WorkerState to = WorkerState::kFailed;
    if (a.forwarded != 0 || a.exit.exit_code == kExitSignal)
      to = WorkerState::kStopped;
    else if (a.exit.hung)
      to = WorkerState::kHung;
    else if (a.exit.exit_code == kExitOk)
      to = WorkerState::kSucceeded;
    set_state(to, child.pid,
              fmt::format(" after {} s ({})", format_seconds(a.exit.seconds), describe(a.exit)));
    return a;
  }

  static bool sleep_unless_stopped(double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      if (stop_signal() != 0) return false;
      std::this_thread::sleep_for(std::min<Clock::duration>(
          kPollInterval, std::chrono::duration_cast<Clock::duration>(end - Clock::now())));
    }
    return stop_signal() == 0;
  }

  const SupervisorOptions& options_;
  WorkerState state_ = WorkerState::kStarting;
};

}  // namespace

const char* state_name(WorkerState state) noexcept {
  static const char* const kNames[] = {"starting", "running", "succeeded",
                                       "failed",   "stopped", "hung"};
  return kNames[static_cast<int>(state)];
}

bool should_restart(const WorkerExit& e) {
  const int c = e.exit_code;
  return e.hung || e.signal != 0 ||
         (c != kExitOk && c != kExitUsage && c != kExitNoResume && c != kExitSignal);
}

std::string describe(const WorkerExit& e) {
  if (e.hung) return "hung: no progress for " + format_seconds(e.stalled_seconds) + " s";
  if (e.signal != 0) {
    return ::sigabbrev_np(e.signal)
               ? fmt::format("killed by signal {} ({})", e.signal, signal_name(e.signal))
               : fmt::format("killed by signal {}", e.signal);
  }
  return fmt::format("exited with code {}", e.exit_code);
}

int supervise(const SupervisorOptions& options) {
  if (options.argv.empty()) throw std::invalid_argument("supervise: argv is empty");
  if (options.max_restarts < 0)
    throw std::invalid_argument("max_restarts must be >= 0, got " +
                                std::to_string(options.max_restarts));
  if (options.hang_timeout < 0 || (options.hang_timeout > 0 && options.progress_file.empty()))
    throw std::invalid_argument("hang_timeout must be >= 0 and needs progress_file, got " +
                                std::to_string(options.hang_timeout));
  if (!(options.backoff_initial >= 0) || !(options.backoff_max >= options.backoff_initial))
    throw std::invalid_argument("backoff needs 0 <= backoff_initial <= backoff_max");
  return Supervisor(options).run();
}

}  // namespace gpurun

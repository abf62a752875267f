#include "launch/supervisor.h"

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
#include <thread>
#include <tuple>
#include <utility>

#include <spdlog/spdlog.h>

#include "distributed/worker_env.h"
#include "gpurun/errors.h"
#include "util/signals.h"
#include "report/reporter.h"
#include "util/clock.h"


namespace gpurun {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::milliseconds(50);
constexpr size_t kKeptLines = 20;
constexpr size_t kMaxLineChars = 1000;
constexpr auto kDrainLimit = std::chrono::seconds(1);

std::string format_seconds(double s) {
  return s >= 10 ? fmt::format("{:.0f}", s) : fmt::format("{:.1f}", s);
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
  /// `echo`: copy what comes to our stderr (the first worker only; the others log to files).
  StderrTap(int fd, bool echo) : fd_(fd), echo_(echo), thread_([this] { read_loop(); }) {}
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

  void push_line() {
    lines_.push_back(std::move(partial_));
    partial_.clear();
    if (lines_.size() > kKeptLines) lines_.pop_front();
  }

  int fd_;
  bool echo_;
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

/// Our environment with `extra` (then the worker's own variables) over it, as KEY=VALUE.
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
  bool hung = false;        // killed by the watchdog
  double stalled_seconds = 0;
};

/// "rank 1 killed by signal 9 (SIGKILL) at step 412", "worker exited with code 1".
std::string cause(const WorkerExit& e) {
  std::string out = (e.name.empty() ? "worker" : e.name) + " " + describe(e);
  if (e.step >= 0) out += " at step " + std::to_string(e.step);
  return out;
}

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
        spdlog::warn("{} after a stop signal; not restarting", cause(e));
        return e.signal != 0 ? kExitSignal : e.exit_code;  // a signal ends in 75, never 143
      }
      history += fmt::format("{}run {}: {} after {} s", history.empty() ? "" : "; ", restart,
                             cause(e), format_seconds(e.seconds));
      const std::string hint = e.signal == SIGKILL && !e.hung
                                   ? " (a SIGKILL nobody asked for is often the kernel's OOM "
                                     "killer: see dmesg)"
                                   : "";
      if (restart >= options_.max_restarts) {
        spdlog::error(
            "{}{} at restart {}/{}; no restarts left, giving up ({}); last lines "
            "of its stderr:{}",
            cause(e), hint, restart, options_.max_restarts, history, indent_lines(e.last_lines));
        return kExitFailure;
      }
      failures_without_progress = a.progressed ? 1 : failures_without_progress + 1;
      const double delay =
          std::min(options_.backoff_max,
                   options_.backoff_initial * std::pow(2.0, failures_without_progress - 1));
      spdlog::warn("{}{} at restart {}/{}; restarting in {} s; last lines of its stderr:{}",
                   cause(e), hint, restart, options_.max_restarts, format_seconds(delay),
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
      spdlog::error("{} ({}); not retried", cause(e),
                    e.exit_code == kExitUsage ? "usage or config error" : "cannot resume");
    } else if (e.exit_code == kExitSignal) {
      spdlog::warn("{} (stopped by a signal); not restarting", cause(e));
    }
    return e.exit_code;
  }

  void set_state(WorkerState to, pid_t pid, const std::string& detail) {
    spdlog::info("worker{}: {} -> {}{}", pid > 0 ? fmt::format(" pid {}", pid) : "",
                 state_name(state_), state_name(to), detail);
    state_ = to;
  }

  /// One running worker of the group.
  struct Running {
    Child child;
    std::unique_ptr<StderrTap> tap;
    bool done = false;
    WorkerExit exit;
  };

  /// Sends `sig` to every worker not yet reaped: to its pid, or with `whole_group` to its
  /// whole process group (what it started too).
  static void signal_alive(const std::vector<Running>& running, int sig, bool whole_group) {
    for (const Running& r : running)
      if (!r.done) ::kill(whole_group ? -r.child.pid : r.child.pid, sig);
  }

  std::vector<SupervisorOptions::Worker> group() const {
    if (!options_.workers.empty()) return options_.workers;
    return {SupervisorOptions::Worker{{}, "worker", ""}};
  }

  /// Among workers that ended in the same poll, the likeliest root cause: a death by a signal
  /// before an exit code other than 1 before exit 1 (a peer's death makes the others' collectives
  /// fail with 1), then the lowest rank.
  static int severity(const WorkerExit& e) {
    if (e.signal != 0) return 3;
    if (e.exit_code != kExitFailure) return 2;
    return 1;
  }

  Attempt run_once(int restart) {
    Attempt a;
    state_ = WorkerState::kStarting;
    std::string command;
    for (const std::string& arg : options_.argv) command += (command.empty() ? "" : " ") + arg;
    const std::vector<SupervisorOptions::Worker> workers = group();
    spdlog::info("{}: starting (restart {}/{}): {}",
                 workers.size() > 1 ? fmt::format("{} workers", workers.size()) : "worker",
                 restart, options_.max_restarts, command);
    // Progress is a change of the heartbeat seen during this run, timed by our steady clock: a
    // file left by an earlier run does not count, and neither does a file server's clock.
    HeartbeatKey beat = heartbeat_key(options_.progress_file);
    const auto start = Clock::now();
    auto last_progress = start;
    std::vector<Running> running(workers.size());
    for (size_t i = 0; i < workers.size(); ++i) {
      running[i].child =
          spawn(options_.argv, child_environment(options_.env, workers[i].env, restart));
      running[i].tap = std::make_unique<StderrTap>(running[i].child.stderr_fd, i == 0);
      running[i].exit.name = workers[i].name;
      if (running[i].child.exec_errno != 0) a.exec_errno = running[i].child.exec_errno;
    }
    if (a.exec_errno == 0) set_state(WorkerState::kRunning, running[0].child.pid, "");
    int root = -1;          // index of the first failure
    bool stopping = false;  // a worker exited 75, or we forwarded a stop signal
    Clock::time_point kill_at = Clock::time_point::max();
    if (a.exec_errno != 0) {
      for (Running& r : running) ::kill(-r.child.pid, SIGKILL);
      kill_at = Clock::now();
    }
    size_t alive = running.size();
    while (alive > 0) {
      std::vector<int> ended;
      for (size_t i = 0; i < running.size(); ++i) {
        Running& r = running[i];
        if (r.done) continue;
        int status = 0;
        const pid_t w = ::waitpid(r.child.pid, &status, WNOHANG);
        if (w < 0 && errno != EINTR) throw IoError("waitpid", options_.argv[0], errno);
        if (w != r.child.pid) continue;
        r.done = true;
        --alive;
        r.exit.seconds = seconds_since(start);
        if (WIFEXITED(status)) r.exit.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) r.exit.signal = WTERMSIG(status);
        if (!workers[i].heartbeat_file.empty())
          r.exit.step = read_heartbeat_step(workers[i].heartbeat_file);
        ended.push_back(static_cast<int>(i));
      }
      if (root < 0 && a.exec_errno == 0) {
        for (int i : ended) {
          const WorkerExit& e = running[i].exit;
          if (e.exit_code == kExitOk || (e.exit_code == kExitSignal && e.signal == 0)) continue;
          if (root < 0 || severity(e) > severity(running[root].exit)) root = i;
        }
        if (root >= 0 && alive > 0) {
          spdlog::error("{} {}; stopping the other {} worker(s) (SIGTERM, SIGKILL after {} s)",
                        running[root].exit.name, describe(running[root].exit), alive,
                        format_seconds(options_.stop_timeout));
          signal_alive(running, SIGTERM, false);
          kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(options_.stop_timeout));
        }
      }
      for (int i : ended)
        if (running[i].exit.exit_code == kExitSignal) stopping = true;
      if (alive == 0) break;
      if (const int sig = stop_signal(); sig != 0 && a.forwarded == 0) {
        // SIGINT goes on as SIGTERM: where a scheduler signals every process of the job, the
        // child would otherwise see two SIGINTs, which means "stop now, without saving".
        const int forward = sig == SIGINT ? SIGTERM : sig;
        spdlog::warn("{} received; forwarding {} to {} worker(s) and waiting for them",
                     signal_name(sig), signal_name(forward), alive);
        signal_alive(running, forward, false);
        a.forwarded = sig;
        stopping = true;
      }
      if (const HeartbeatKey now = heartbeat_key(options_.progress_file); now != beat) {
        beat = now;
        last_progress = Clock::now();
        a.progressed = true;
      }
      const double stalled = seconds_since(last_progress);
      if (options_.hang_timeout > 0 && !a.hung && !stopping && root < 0 &&
          stalled >= options_.hang_timeout) {
        spdlog::error("no progress for {} s ({} unchanged); killing every worker's process "
                      "group with SIGKILL",
                      format_seconds(stalled), options_.progress_file);
        signal_alive(running, SIGKILL, true);
        a.hung = true;
        a.stalled_seconds = stalled;
      }
      if (Clock::now() >= kill_at) {
        signal_alive(running, SIGKILL, true);
        kill_at = Clock::time_point::max();
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    if (heartbeat_key(options_.progress_file) != beat) a.progressed = true;  // a last beat
    for (Running& r : running) {
      // Processes a worker left in its group would hold memory and ports.
      if (!a.hung && ::kill(-r.child.pid, 0) == 0) {
        spdlog::warn("killing the processes worker pid {} left in its process group", r.child.pid);
        ::kill(-r.child.pid, SIGKILL);
      }
      r.exit.last_lines = r.tap->finish();
    }
    // The attempt's outcome: the root cause, else a stopped or hung worker, else the first one.
    int pick = root;
    for (size_t i = 0; pick < 0 && i < running.size(); ++i)
      if (running[i].exit.exit_code == kExitSignal || running[i].exit.signal != 0)
        pick = static_cast<int>(i);
    a.exit = running[pick < 0 ? 0 : pick].exit;
    if (a.hung) {
      a.exit.hung = true;
      a.exit.stalled_seconds = a.stalled_seconds;
    }
    if (a.exec_errno != 0) {
      set_state(WorkerState::kFailed, running[0].child.pid, ": execve failed");
      return a;
    }
    WorkerState to = WorkerState::kFailed;
    if (a.forwarded != 0 || (root < 0 && stopping))
      to = WorkerState::kStopped;
    else if (a.exit.hung)
      to = WorkerState::kHung;
    else if (a.exit.exit_code == kExitOk)
      to = WorkerState::kSucceeded;
    set_state(to, running.size() == 1 ? running[0].child.pid : -1,
              fmt::format(" after {} s ({}{})", format_seconds(a.exit.seconds),
                          running.size() > 1 ? a.exit.name + " " : "", describe(a.exit)));
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

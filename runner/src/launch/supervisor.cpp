#include "launch/supervisor.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

#include "config/shown.h"
#include "gpurun/errors.h"
#include "launch/worker_process.h"
#include "report/reporter.h"
#include "util/clock.h"
#include "util/error_report.h"
#include "util/signals.h"
#include "util/units.h"

namespace gpurun {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::milliseconds(50);

/// One worker of the group while it runs.
struct Running {
  SupervisorOptions::Worker spec;
  Child child;
  std::unique_ptr<StderrTap> tap;
  HeartbeatKey beat;       ///< its heartbeat file as it was before the worker started
  std::string error_file;  ///< where it leaves its error (util/error_report.h)
  bool done = false;       ///< reaped
};

/// A private folder for the workers' error files, removed with what is in it.
class ErrorFolder {
 public:
  ErrorFolder() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/gpurun-errors-XXXXXX";
    if (::mkdtemp(pattern.data())) path_ = pattern;
  }
  ~ErrorFolder() {
    if (path_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ErrorFolder(const ErrorFolder&) = delete;
  ErrorFolder& operator=(const ErrorFolder&) = delete;
  /// The file of worker `i`; "" when the folder could not be made (no reports then).
  std::string file(size_t i) const {
    return path_.empty() ? "" : path_ + "/worker-" + std::to_string(i) + ".json";
  }

 private:
  std::string path_;
};

/// One run of the group: its workers, their exits, and what the monitor has seen so far.
struct Group {
  std::vector<Running> workers;
  std::vector<WorkerExit> exits;  ///< parallel to workers, filled in as they are reaped
  size_t alive = 0;               ///< workers not yet reaped
  int exec_errno = 0;             ///< execve failed for a worker: nothing ran
  int root = -1;                  ///< index of the root cause, -1 while none failed
  bool stopping = false;          ///< a worker exited 75, or we forwarded a stop signal
  int forwarded = 0;              ///< the stop signal we received and forwarded, 0 when none
  bool hung = false;              ///< killed by the watchdog
  double stalled_seconds = 0;     ///< when hung: seconds without progress before the kill
  bool progressed = false;        ///< the heartbeat changed during the run
  HeartbeatKey beat;              ///< the progress file as last seen
  Clock::time_point start, last_progress;
  Clock::time_point kill_at = Clock::time_point::max();  ///< SIGKILL what is left then
};

/// How one run of the group ended, as torchelastic's RunResult: the exit that stands for it
/// (the root cause when a worker failed); the group's final state is Supervisor::state_.
struct RunResult {
  WorkerExit exit;
  bool echoed = true;       ///< its stderr was echoed to ours as it came
  int forwarded = 0;        ///< the stop signal we received and forwarded, 0 when none
  bool progressed = false;  ///< the heartbeat changed during the run
  int exec_errno = 0;       ///< execve failed: nothing ran
};

/// The state machine: start the group, monitor it until every worker is reaped (picking the
/// root cause, forwarding a stop, ticking the watchdog), then end, or back off and restart.
class Supervisor {
 public:
  explicit Supervisor(const SupervisorOptions& options) : options_(options) {}

  int run() {
    const int code = supervise_runs();
    if (last_ && last_->lease_held) {
      // Another run holds the directory and goes on: this launch never was the run.
      if (options_.notify)
        spdlog::info("notify: no `failed` message: another run holds the checkpoint directory");
      return code;
    }
    if (code != kExitOk && code != kExitSignal && code != kExitBudget && options_.notify) {
      nlohmann::json details = {{"restarts", restarts_}, {"exit_code", code}};
      if (last_) {
        const std::string error = error_line(*last_);
        details["error"] = error.empty() ? cause(*last_) : error;
        details["cause"] = cause(*last_);
        if (last_->step >= 0) details["step"] = last_->step;
      }
      options_.notify("failed", details);
    }
    return code;
  }

 private:
  int supervise_runs() {
    for (int restart = 0;; ++restart) {
      restarts_ = restart;
      if (const int sig = stop_signal(); sig != 0) {
        spdlog::warn("{} received; not starting the worker", signal_name(sig));
        return kExitSignal;
      }
      start_group(restart);
      const RunResult r = monitor();
      if (r.exec_errno != 0) {
        spdlog::error("cannot execute {}: {}; not retried", options_.argv[0],
                      std::strerror(r.exec_errno));
        return kExitFailure;
      }
      const WorkerExit& e = r.exit;
      last_ = e;
      if (options_.on_worker_exit) options_.on_worker_exit(e);
      if (!should_restart(e)) return final_code(e, r.echoed);
      if (r.forwarded != 0 || stop_signal() != 0) {
        spdlog::warn("{} after a stop signal; not restarting", cause(e));
        return e.signal != 0 ? kExitSignal : e.exit_code;  // a signal ends in 75, never 143
      }
      history_ += fmt::format("{}run {}: {} after {} s", history_.empty() ? "" : "; ", restart,
                              cause(e), format_seconds(e.seconds));
      if (previous_ && repeats(e, *previous_)) {
        spdlog::error(
            "{} again, with the same error: {}; a restart resumes the same checkpoint and data, so "
            "it would fail the same way: not restarting ({})",
            cause(e), error_line(e), history_);
        return kExitFailure;
      }
      previous_ = e;
      if (restart >= options_.max_restarts) {
        spdlog::error(
            "{}{} at restart {}/{}; no restarts left, giving up ({}); last lines "
            "of its stderr:{}",
            cause(e), kill_hint(e), restart, options_.max_restarts, history_, last_lines_block(e));
        return kExitFailure;
      }
      if (!back_off(r, restart)) return kExitSignal;
    }
  }

  /// Starts every worker of the group (state starting, then running). When one cannot be
  /// executed, every started one is killed at once, for monitor() to reap.
  void start_group(int restart) {
    state_ = WorkerState::kStarting;
    std::string command;
    // A webhook's URL given with --set is a secret the log must not show.
    for (const std::string& arg : options_.argv)
      command += (command.empty() ? "" : " ") + shown_argument(arg);
    const std::vector<SupervisorOptions::Worker> specs = worker_specs();
    spdlog::info("{}: starting (restart {}/{}): {}",
                 specs.size() > 1 ? fmt::format("{} workers", specs.size()) : "worker", restart,
                 options_.max_restarts, command);
    group_ = Group{};
    // Progress is a change of the heartbeat seen during this run, timed by our steady clock: a
    // file left by an earlier run does not count, and neither does a file server's clock.
    group_.beat = heartbeat_key(options_.progress_file);
    group_.start = group_.last_progress = Clock::now();
    group_.workers.resize(specs.size());
    group_.exits.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      Running& w = group_.workers[i];
      w.spec = specs[i];
      w.beat = heartbeat_key(w.spec.heartbeat_file);
      w.error_file = errors_.file(i);
      if (!w.error_file.empty()) {
        ::unlink(w.error_file.c_str());  // an earlier run's
        w.spec.env[kErrorFileVariable] = w.error_file;
      }
      w.child = spawn(options_.argv, child_environment(options_.env, w.spec.env, restart));
      w.tap = std::make_unique<StderrTap>(w.child.stderr_fd, i == 0);
      group_.exits[i].name = w.spec.name;
      if (w.child.exec_errno != 0) group_.exec_errno = w.child.exec_errno;
    }
    group_.alive = specs.size();
    if (group_.exec_errno != 0) {
      for (const Running& w : group_.workers) ::kill(-w.child.pid, SIGKILL);
      group_.kill_at = Clock::now();
    } else {
      set_state(WorkerState::kRunning, group_.workers[0].child.pid, "");
    }
  }

  /// Polls the group every 50 ms until every worker is reaped, then returns how it ended.
  RunResult monitor() {
    while (true) {
      const std::vector<int> ended = reap();
      if (group_.root < 0 && group_.exec_errno == 0) pick_root_cause(ended);
      for (int i : ended)
        if (group_.exits[i].exit_code == kExitSignal) group_.stopping = true;
      if (group_.alive == 0) break;
      forward_stop();
      watchdog_tick();
      std::this_thread::sleep_for(kPollInterval);
    }
    return finish_group();
  }

  /// Reaps the workers that exited since the last poll, reading the step each reached from its
  /// heartbeat file (its last beat is written before it exits; a SIGKILL leaves the beat of up to
  /// a second before). Returns their indices.
  std::vector<int> reap() {
    std::vector<int> ended;
    for (size_t i = 0; i < group_.workers.size(); ++i) {
      Running& w = group_.workers[i];
      if (w.done) continue;
      int status = 0;
      const pid_t got = ::waitpid(w.child.pid, &status, WNOHANG);
      if (got < 0 && errno != EINTR) throw IoError("waitpid", options_.argv[0], errno);
      if (got != w.child.pid) continue;
      w.done = true;
      --group_.alive;
      WorkerExit& e = group_.exits[i];
      e.seconds = seconds_since(group_.start);
      e.failed_at = unix_seconds();
      if (WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
      if (!w.error_file.empty())
        if (const std::optional<ErrorReport> report = read_error_report(w.error_file)) {
          e.failed_at = report->time;
          e.peer_failure = report->peer_failure;
          e.lease_held = report->lease_held;
        }
      // Only a heartbeat this worker wrote: one left by an earlier run (a rank that now fails
      // before its first step, at a config check) names a step this run never reached, and
      // one beside a run that holds the directory is that run's.
      if (!e.lease_held && !w.spec.heartbeat_file.empty() &&
          heartbeat_key(w.spec.heartbeat_file) != w.beat)
        e.step = read_heartbeat_step(w.spec.heartbeat_file);
      ended.push_back(static_cast<int>(i));
    }
    return ended;
  }

  /// The first failure among the workers reaped in one poll stops the group: the others get
  /// SIGTERM, and SIGKILL after stop_timeout seconds (watchdog_tick). The root cause is decided
  /// once every worker is reaped (finish_group): a reaction to a peer may end first.
  void pick_root_cause(const std::vector<int>& ended) {
    group_.root = root_cause_among(group_.exits, ended);
    if (group_.root < 0 || group_.alive == 0) return;
    const WorkerExit& e = group_.exits[group_.root];
    spdlog::error("{} {}{}; stopping the other {} worker(s) (SIGTERM, SIGKILL after {} s)", e.name,
                  describe(e),
                  e.peer_failure ? " (a collective failed: a reaction to another rank?)" : "",
                  group_.alive, format_seconds(options_.stop_timeout));
    signal_alive(SIGTERM, false);
    group_.kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(options_.stop_timeout));
  }

  /// Forwards the first stop signal we received to every live worker, once.
  void forward_stop() {
    const int sig = stop_signal();
    if (sig == 0 || group_.forwarded != 0) return;
    // SIGINT goes on as SIGTERM: where a scheduler signals every process of the job, the
    // child would otherwise see two SIGINTs, which means "stop now, without saving".
    // A signal added by --slurm-signal goes on as SIGTERM too: a worker that has not yet
    // installed its handler would take its default action (ignore or die) instead of saving.
    const int forward = sig == SIGINT || !is_default_stop_signal(sig) ? SIGTERM : sig;
    spdlog::warn("{} received; forwarding {} to {} worker(s) and waiting for them",
                 signal_name(sig), signal_name(forward), group_.alive);
    signal_alive(forward, false);
    group_.forwarded = sig;
    group_.stopping = true;
  }

  /// Notes progress of the heartbeat; kills every worker's process group (SIGKILL: a hung
  /// process may not handle SIGTERM) after hang_timeout seconds without it, unless the group
  /// is stopping anyway; and kills what is left once the stop deadline has passed.
  void watchdog_tick() {
    if (const HeartbeatKey now = heartbeat_key(options_.progress_file); now != group_.beat) {
      group_.beat = now;
      group_.last_progress = Clock::now();
      group_.progressed = true;
    }
    const double stalled = seconds_since(group_.last_progress);
    if (options_.hang_timeout > 0 && !group_.hung && !group_.stopping && group_.root < 0 &&
        stalled >= options_.hang_timeout) {
      spdlog::error(
          "no progress for {} s ({} unchanged); killing every worker's process "
          "group with SIGKILL",
          format_seconds(stalled), options_.progress_file);
      signal_alive(SIGKILL, true);
      group_.hung = true;
      group_.stalled_seconds = stalled;
      if (options_.notify) {
        nlohmann::json details = {{"stalled_seconds", stalled}};
        if (const int64_t step = read_heartbeat_step(options_.progress_file); step >= 0)
          details["step"] = step;
        options_.notify("stalled", details);
      }
    }
    if (Clock::now() >= group_.kill_at) {
      signal_alive(SIGKILL, true);
      group_.kill_at = Clock::time_point::max();
    }
  }

  /// Once every worker is reaped: kills what they left in their process groups, collects their
  /// stderr, and picks the exit and the final state of the run.
  RunResult finish_group() {
    RunResult r;
    r.exec_errno = group_.exec_errno;
    r.forwarded = group_.forwarded;
    r.progressed = group_.progressed || heartbeat_key(options_.progress_file) != group_.beat;
    for (size_t i = 0; i < group_.workers.size(); ++i) {
      const Running& w = group_.workers[i];
      // Processes a worker left in its group would hold memory and ports.
      if (!group_.hung && ::kill(-w.child.pid, 0) == 0) {
        spdlog::warn("killing the processes worker pid {} left in its process group", w.child.pid);
        ::kill(-w.child.pid, SIGKILL);
      }
      group_.exits[i].last_lines = w.tap->finish();
    }
    // The first failure in time that is not a reaction to a peer, whichever ended first.
    const int first_reaped = group_.root;
    group_.root = root_cause_of(group_.exits, first_reaped);
    if (first_reaped >= 0 && group_.root != first_reaped) {
      const WorkerExit& root = group_.exits[group_.root];
      spdlog::error("{} failed first{}: {}", root.name,
                    root.step >= 0 ? fmt::format(" (at step {})", root.step) : "", describe(root));
    }
    r.exit = group_.exits[outcome_of(group_.exits, group_.root)];
    // Its stderr, when it was not echoed as it came (only the first worker's is).
    r.echoed = outcome_of(group_.exits, group_.root) == 0;
    if (group_.hung) {
      r.exit.hung = true;
      r.exit.stalled_seconds = group_.stalled_seconds;
    }
    const pid_t first = group_.workers[0].child.pid;
    if (r.exec_errno != 0) {
      set_state(WorkerState::kFailed, first, ": execve failed");
      return r;
    }
    WorkerState to = WorkerState::kFailed;
    if (r.forwarded != 0 || (group_.root < 0 && group_.stopping))
      to = WorkerState::kStopped;
    else if (r.exit.hung)
      to = WorkerState::kHung;
    else if (r.exit.exit_code == kExitOk)
      to = WorkerState::kSucceeded;
    else if (r.exit.exit_code == kExitBudget || r.exit.exit_code == kExitSignal)
      to = WorkerState::kStopped;  // it saved and stopped: at its budget, or for a notice
    const bool several = group_.workers.size() > 1;
    set_state(to, several ? -1 : first,
              fmt::format(" after {} s ({}{})", format_seconds(r.exit.seconds),
                          several ? r.exit.name + " " : "", describe(r.exit)));
    return r;
  }

  /// Before a restart: waits the backoff, which doubles per failed run without progress in
  /// between. Returns false when a stop signal arrived during it.
  bool back_off(const RunResult& r, int restart) {
    failures_without_progress_ = r.progressed ? 1 : failures_without_progress_ + 1;
    const double delay =
        std::min(options_.backoff_max,
                 options_.backoff_initial * std::pow(2.0, failures_without_progress_ - 1));
    spdlog::warn("{}{} at restart {}/{}; restarting in {} s; last lines of its stderr:{}",
                 cause(r.exit), kill_hint(r.exit), restart, options_.max_restarts,
                 format_seconds(delay), last_lines_block(r.exit));
    if (sleep_unless_stopped(delay)) return true;
    spdlog::warn("{} received during the backoff; not restarting the worker",
                 signal_name(stop_signal()));
    return false;
  }

  /// The code for an exit that is not retried (0, 2, 3, 75), logged with its meaning, and with
  /// the last lines of its stderr when they were not `echoed` as they came.
  static int final_code(const WorkerExit& e, bool echoed) {
    if (e.exit_code == kExitUsage || e.exit_code == kExitNoResume) {
      spdlog::error("{} ({}); not retried{}", cause(e),
                    e.exit_code == kExitUsage ? "usage or config error" : "cannot resume",
                    echoed ? "" : "; last lines of its stderr:" + last_lines_block(e));
    } else if (e.exit_code == kExitSignal) {
      spdlog::warn("{} (stopped by a signal); not restarting", cause(e));
    } else if (e.exit_code == kExitBudget) {
      spdlog::warn("{} (stopped at cost.budget); not restarting", cause(e));
    }
    return e.exit_code;
  }

  void set_state(WorkerState to, pid_t pid, const std::string& detail) {
    spdlog::info("worker{}: {} -> {}{}", pid > 0 ? fmt::format(" pid {}", pid) : "",
                 state_name(state_), state_name(to), detail);
    state_ = to;
  }

  /// Sends `sig` to every worker not yet reaped: to its pid, or with `whole_group` to its
  /// whole process group (what it started too); they count as stopped, not failed.
  void signal_alive(int sig, bool whole_group) {
    for (size_t i = 0; i < group_.workers.size(); ++i) {
      const Running& w = group_.workers[i];
      if (w.done) continue;
      ::kill(whole_group ? -w.child.pid : w.child.pid, sig);
      group_.exits[i].stopped = true;
    }
  }

  /// The workers to start: options_.workers, or one named "worker" whose heartbeat is the
  /// progress file.
  std::vector<SupervisorOptions::Worker> worker_specs() const {
    if (!options_.workers.empty()) return options_.workers;
    return {SupervisorOptions::Worker{{}, "worker", options_.progress_file}};
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
  ErrorFolder errors_;                          ///< the workers' error files
  WorkerState state_ = WorkerState::kStarting;  ///< the group's state, every change logged
  Group group_;                                 ///< the current run
  int failures_without_progress_ = 0;           ///< for the backoff
  std::string history_;
  std::optional<WorkerExit> last_;      ///< how the last run of the group ended
  int restarts_ = 0;                    ///< restarts so far
  std::optional<WorkerExit> previous_;  ///< the last failure restarted, to see it repeat ///< "run
                                        ///< 0: ...; run 1: ..." for giving up
};

}  // namespace

const char* state_name(WorkerState state) noexcept {
  static const char* const kNames[] = {"starting", "running", "succeeded",
                                       "failed",   "stopped", "hung"};
  return kNames[static_cast<int>(state)];
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

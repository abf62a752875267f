#include "queue/queue_runner.h"
#include "util/units.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "config/schema.h"
#include "distributed/worker_env.h"
#include "gpurun/errors.h"
#include "launch/worker_process.h"
#include "queue/queue_lock.h"
#include "queue/queue_state.h"
#include "queue/queue_summary.h"
#include "queue/run_child.h"
#include "report/reporter.h"
#include "util/clock.h"
#include "util/fs.h"
#include "util/signals.h"
#include "util/writable.h"

namespace gpurun {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(100);

/// The entries of a --set list whose key changes what is trained: in the config hash, or not
/// a key at all (the run's own gpurun says so). cost.*, notify.*, log.* and the like may change
/// under a run that has a checkpoint, as they may on a `gpurun run --resume`.
std::vector<std::string> training_sets(const std::vector<std::string>& sets) {
  std::vector<std::string> out;
  for (const std::string& s : sets) {
    std::string key = s.substr(0, s.find('='));
    key.erase(0, key.find_first_not_of(' '));
    key.erase(key.find_last_not_of(' ') + 1);
    const auto& keys = detail::schema();
    const auto it =
        std::find_if(keys.begin(), keys.end(), [&](const detail::Key& k) { return key == k.name; });
    if (it == keys.end() || it->hashed) out.push_back(s);
  }
  return out;
}

class QueueRunner {
 public:
  QueueRunner(const QueueFile& queue, const QueueOptions& options, std::ostream& out)
      : queue_(queue), options_(options), out_(out) {}

  int run() {
    if (options_.parallel < 1)
      throw ConfigError("--parallel must be >= 1, got " + std::to_string(options_.parallel));
    if (options_.max_restarts < 0)
      throw ConfigError("--max-restarts must be >= 0, got " +
                        std::to_string(options_.max_restarts));
    if (options_.hang_timeout < 0)
      throw ConfigError("--hang-timeout must be >= 0, got " +
                        std::to_string(options_.hang_timeout));
    const std::string& dir = options_.dir;
    // As `gpurun run` refuses a --ckpt it cannot write: a usage error (exit 2), with guidance.
    try {
      probe_writable(dir);
      fs::make_dirs(dir + "/runs");
    } catch (const IoError& e) {
      throw ConfigError("queue directory " + dir + " cannot be written (" + e.what() +
                        "); choose a --dir where files can be created");
    }
    QueueLock lock(dir);
    load_state();
    devices_ = cuda_devices(current_environment());
    const unsigned hw = usable_cpus();
    threads_ = std::max(1u, hw / static_cast<unsigned>(options_.parallel));
    if (!devices_.empty() && static_cast<int>(devices_.size()) < options_.parallel)
      spdlog::warn("queue: --parallel {} on {} CUDA device(s): runs share devices",
                   options_.parallel, devices_.size());
    slots_.resize(static_cast<size_t>(options_.parallel));
    for (size_t i = 0; i < slots_.size(); ++i)
      slots_[i].device = devices_.empty() ? "" : devices_[i % devices_.size()];
    retry_at_.assign(state_.runs.size(), Clock::time_point{});
    held_.assign(state_.runs.size(), false);
    save();
    spdlog::info("queue: {} run(s) in {}, {} at a time on {}", state_.runs.size(), dir,
                 options_.parallel,
                 !devices_.empty()       ? fmt::format("{} CUDA device(s)", devices_.size())
                 : options_.parallel > 1 ? fmt::format("CPU ({} thread(s) each)", threads_)
                                         : std::string("CPU"));

    while (true) {
      if (stop_signal() != 0 && !state_.stopping) forward_stop();
      reap();
      watchdog();
      if (!state_.stopping) fill_slots();
      const bool busy =
          std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.run >= 0; });
      if (!busy && (state_.stopping || !work_left())) break;
      std::this_thread::sleep_for(kPoll);
    }
    save();
    const std::vector<SummaryRow> rows = summary_rows(dir, state_);
    write_summary(dir, rows);
    print_summary_table(rows, out_);
    out_ << "summary: " << dir << "/summary.csv, " << dir << "/summary.json\n";
    bool failed = false, unfinished = false, budget = false;
    for (const RunRecord& r : state_.runs) {
      failed = failed || r.state == RunState::kFailed;
      const bool at_budget = r.state == RunState::kInterrupted && r.exit_code == kExitBudget;
      budget = budget || at_budget;
      unfinished = unfinished || (r.state != RunState::kFinished && !at_budget);
    }
    // A stop first: a scheduler that requeues on 75 (Slurm --requeue) must run the rest.
    if (state_.stopping) return kExitSignal;
    if (failed) return kExitFailure;
    if (unfinished) return kExitSignal;  // a run left interrupted: run again
    // Only runs at their budget are left: 4, which no scheduler requeues, since running the
    // queue again would stop them again at once.
    const int code = budget ? kExitBudget : kExitOk;
    run_stop_command(code);
    return code;
  }

 private:
  struct Slot {
    std::string device;  ///< CUDA_VISIBLE_DEVICES for its children; "" on CPU
    int run = -1;        ///< index into state_.runs; -1 when free
    pid_t pid = -1;
    Clock::time_point start;
    HeartbeatKey beat;                ///< the run's heartbeat file as last seen
    Clock::time_point last_progress;  ///< when it last changed (or the child started)
    bool hung = false;                ///< the watchdog killed it
  };

  /// queue.json merged with the queue file: runs by name, their states carried over.
  void load_state() {
    std::optional<QueueState> old;
    try {
      old = read_queue_state(options_.dir);
    } catch (const IoError&) {
      throw;  // the storage failed: retried by whoever restarts us
    } catch (const Error& e) {
      // Not ours to repair: guessing the runs' states could train one twice.
      throw ConfigError(std::string(e.what()) + ": " + options_.dir +
                        " is not a queue directory of this gpurun; use another --dir");
    }
    state_ = QueueState{};
    state_.queue_file = queue_.path;
    state_.host = host_name();
    state_.pid = ::getpid();
    state_.parallel = options_.parallel;
    for (const QueueRun& q : queue_.runs) {
      RunRecord rec;
      rec.name = q.name;
      rec.seed = q.seed;
      rec.config = q.config_path;
      rec.sets = q.sets;
      if (old) {
        for (const RunRecord& o : old->runs) {
          if (o.name != q.name) continue;
          // A run with a checkpoint keeps its definition (its resume would be refused, or
          // worse, continue other training); one that never saved may be corrected.
          const bool trained =
              std::filesystem::exists(run_dir_of(options_.dir, o.name) + "/LATEST");
          const bool changed = o.config != q.config_path || o.sets != q.sets;
          const bool retrains =
              o.config != q.config_path || training_sets(o.sets) != training_sets(q.sets);
          if (trained && retrains)
            throw ConfigError("run " + q.name + " in " + options_.dir + " was started as " +
                              o.config + describe_sets(o.sets) + ", but " + queue_.path +
                              " now gives " + q.config_path + describe_sets(q.sets) +
                              ": a run with a checkpoint keeps its definition; use another "
                              "--dir, or give the changed run a name of its own");
          rec = o;
          rec.pid = 0;
          if (changed) {
            if (trained)
              spdlog::info("queue: {} takes its new{} (they do not change what it trains)", q.name,
                           describe_sets(q.sets));
            rec.config = q.config_path;
            rec.sets = q.sets;
          }
          if (rec.state == RunState::kRunning) {
            // The queue died under this attempt (SIGKILL): its time still counts, up to the
            // last thing the run wrote (its child saved and exited on PR_SET_PDEATHSIG).
            if (rec.attempt_started > 0) {
              const double end = attempt_end_of(options_.dir, rec);
              rec.wall_seconds += end - rec.attempt_started;
              rec.ended = end;
            }
            rec.state = RunState::kInterrupted;
          }
          rec.attempt_started = 0;
          // Running the command again is asking for another try: a failed run starts over
          // (it resumes its checkpoint, if it has one) with its restarts counted afresh.
          if (rec.state == RunState::kFailed) {
            spdlog::info("queue: {} failed before ({}); trying it again", rec.name, rec.error);
            rec.state = trained ? RunState::kInterrupted : RunState::kPending;
            rec.restarts = 0;
            rec.error.clear();
          }
        }
      }
      // The run's own record wins over ours: a queue killed after its child's exit 0 but
      // before queue.json was written must not train that run again.
      if (rec.state != RunState::kFinished) {
        const RunMetrics m = read_run_metrics(run_dir_of(options_.dir, rec.name));
        if (m.done_exit_code && *m.done_exit_code == 0) {
          rec.state = RunState::kFinished;
          rec.exit_code = 0;
          rec.signal = 0;
          rec.error.clear();
        }
      }
      if (rec.state == RunState::kFinished) check_final_checkpoint(rec);
      state_.runs.push_back(std::move(rec));
    }
    if (old) {
      for (const RunRecord& o : old->runs) {
        const bool kept = std::any_of(queue_.runs.begin(), queue_.runs.end(),
                                      [&](const QueueRun& q) { return q.name == o.name; });
        if (!kept)
          spdlog::warn("queue: run {} ({}) is no longer in {}; its directory {} stays", o.name,
                       run_state_name(o.state), queue_.path, run_dir_of(options_.dir, o.name));
      }
    }
  }

  /// A finished run is skipped only while the final checkpoint it saved verifies, checksums
  /// read: otherwise its result is gone (four bytes of model.pt changed), and it is trained
  /// again from its newest good checkpoint, which is exact (its resume sets the damaged one
  /// aside).
  void check_final_checkpoint(RunRecord& rec) const {
    const RunCheckpoints checked =
        check_run_checkpoints(run_dir_of(options_.dir, rec.name), /*verify=*/true);
    if (checked.problem.empty()) return;
    spdlog::warn(
        "queue: {} finished, but its final checkpoint is not intact: {}; training it again from "
        "its newest good checkpoint",
        rec.name, checked.problem);
    rec.state = RunState::kInterrupted;
    rec.error = "its final checkpoint was damaged: " + checked.problem;
  }

  static std::string describe_sets(const std::vector<std::string>& sets) {
    std::string out;
    for (const std::string& s : sets) out += " --set " + s;
    return out;
  }

  void save() { write_queue_state(options_.dir, state_); }

  bool work_left() const {
    for (size_t i = 0; i < state_.runs.size(); ++i) {
      const RunState s = state_.runs[i].state;
      if ((s == RunState::kPending || s == RunState::kInterrupted) && !held_[i]) return true;
    }
    return false;
  }

  void fill_slots() {
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].run >= 0) continue;
      const int next = next_runnable();
      if (next < 0) return;
      start(slots_[s], next);
    }
  }

  int next_runnable() const {
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < state_.runs.size(); ++i) {
      const RunRecord& r = state_.runs[i];
      const bool waiting = r.state == RunState::kPending || r.state == RunState::kInterrupted;
      const bool taken = std::any_of(slots_.begin(), slots_.end(),
                                     [&](const Slot& s) { return s.run == static_cast<int>(i); });
      if (waiting && !taken && !held_[i] && retry_at_[i] <= now) return static_cast<int>(i);
    }
    return -1;
  }

  void start(Slot& slot, int index) {
    RunRecord& r = state_.runs[static_cast<size_t>(index)];
    const std::string run_dir = run_dir_of(options_.dir, r.name);
    fs::make_dirs(run_dir);
    if (r.attempts == 0 && devices_.empty() && options_.parallel > 1 &&
        !has_set(r.sets, "train.threads") && !config_sets_threads(r.config))
      r.queue_sets = {"train.threads=" + std::to_string(threads_)};
    std::vector<std::string> sets = r.sets;
    sets.insert(sets.end(), r.queue_sets.begin(), r.queue_sets.end());
    const std::vector<std::string> argv =
        run_argv(options_.binary, options_.dir, r.name, r.config, sets);
    std::map<std::string, std::string> extra;
    if (!slot.device.empty()) extra["CUDA_VISIBLE_DEVICES"] = slot.device;
    extra[kQueueVariable] = options_.dir;  // its cost.stop_command is the queue's to run
    std::string command;
    for (const std::string& a : argv) command += (command.empty() ? "" : " ") + a;
    const bool resumed = r.state == RunState::kInterrupted;
    const std::string header =
        fmt::format("gpurun queue: {} {} (attempt {}, restart {}/{}) on {} at {}: {}\n",
                    resumed ? "resuming" : "starting", r.name, r.attempts + 1, r.restarts,
                    options_.max_restarts, slot.device.empty() ? "cpu" : "cuda " + slot.device,
                    unix_seconds(), command);
    const int out_fd = open_log(run_dir + "/stdout.log");
    const int err_fd = open_log(run_dir + "/stderr.log");
    const ssize_t ignored = ::write(err_fd, header.data(), header.size());
    (void)ignored;
    Child child;
    try {
      child = spawn_to_files(argv, child_environment(extra, {}, r.restarts), out_fd, err_fd);
    } catch (...) {
      ::close(out_fd);
      ::close(err_fd);
      throw;
    }
    ::close(out_fd);
    ::close(err_fd);
    spdlog::info("queue: {} {} (pid {}{}); log {}/stderr.log", resumed ? "resuming" : "starting",
                 r.name, child.pid, slot.device.empty() ? "" : ", CUDA device " + slot.device,
                 run_dir);
    ++r.attempts;
    if (r.started == 0) r.started = unix_seconds();
    r.attempt_started = unix_seconds();
    r.state = RunState::kRunning;
    r.pid = child.pid;
    r.device = slot.device.empty() ? "cpu" : "cuda:" + slot.device;
    slot.run = index;
    slot.pid = child.pid;
    slot.start = slot.last_progress = Clock::now();
    slot.beat = heartbeat_key(heartbeat_path(run_dir, 0));
    slot.hung = false;
    save();
  }

  int open_log(const std::string& path) const {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw IoError("open", path, errno);
    return fd;
  }

  void reap() {
    for (Slot& slot : slots_) {
      if (slot.run < 0) continue;
      int status = 0;
      const pid_t got = ::waitpid(slot.pid, &status, WNOHANG);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw IoError("waitpid", options_.binary, errno);
      if (got != slot.pid) continue;
      ended(slot, status);
    }
  }

  /// Kills (SIGKILL: a hung process may not handle SIGTERM) the process group of a run whose
  /// heartbeat file did not change for hang_timeout seconds; its end then counts as a failure.
  /// Progress is a change seen during this attempt, timed by our clock (supervisor.h's rule).
  void watchdog() {
    if (options_.hang_timeout <= 0) return;
    for (Slot& slot : slots_) {
      if (slot.run < 0 || slot.hung) continue;
      const RunRecord& r = state_.runs[static_cast<size_t>(slot.run)];
      const HeartbeatKey now = heartbeat_key(heartbeat_path(run_dir_of(options_.dir, r.name), 0));
      if (now != slot.beat) {
        slot.beat = now;
        slot.last_progress = Clock::now();
        continue;
      }
      if (seconds_since(slot.last_progress) < options_.hang_timeout) continue;
      spdlog::error("queue: {} made no progress for {} s (--hang-timeout); killing it", r.name,
                    options_.hang_timeout);
      ::kill(-slot.pid, SIGKILL);
      slot.hung = true;
    }
  }

  void ended(Slot& slot, int status) {
    const size_t index = static_cast<size_t>(slot.run);
    RunRecord& r = state_.runs[index];
    const std::string run_dir = run_dir_of(options_.dir, r.name);
    r.wall_seconds += seconds_since(slot.start);
    r.ended = unix_seconds();
    r.attempt_started = 0;
    r.pid = 0;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    const bool hung = slot.hung;
    slot.run = -1;
    slot.pid = -1;
    slot.hung = false;
    const bool stopping = (state_.stopping || stop_signal() != 0) && !hung;
    const std::string how =
        hung ? fmt::format("hung (no progress for {} s) and was killed", options_.hang_timeout)
             : describe_exit(r.exit_code, r.signal);
    if (r.exit_code == kExitOk && !hung) {
      r.state = RunState::kFinished;
      r.error.clear();
      spdlog::info("queue: {} finished in {}", r.name, format_duration(r.wall_seconds));
    } else if (r.exit_code == kExitBudget && !hung) {
      // It saved and stopped at its cost.budget: another try spends nothing more until the
      // budget is raised, so it waits for the next invocation, as a run stopped alone does.
      r.state = RunState::kInterrupted;
      held_[index] = true;
      r.error = "stopped at its cost.budget after saving (exit 4)";
      spdlog::warn(
          "queue: {} stopped at its cost.budget after saving (exit 4); it is not restarted: "
          "raise cost.budget in its config or in the queue file's set: and run the same command to "
          "resume it",
          r.name);
    } else if (stopping && (r.exit_code == kExitSignal || r.signal != 0)) {
      r.state = RunState::kInterrupted;
      spdlog::warn("queue: {} stopped ({}); the same command resumes it", r.name, how);
    } else if (r.exit_code == kExitSignal) {
      // Someone stopped this run alone (a `kill` of its pid to free its device): it saved, and
      // is not restarted behind their back; the same command resumes it.
      r.state = RunState::kInterrupted;
      held_[index] = true;
      spdlog::warn(
          "queue: {} was stopped by a signal the queue did not get (exit 75); it is "
          "not restarted now: the same command resumes it",
          r.name);
    } else if (r.exit_code == kExitUsage || r.exit_code == kExitNoResume || r.exit_code == 127) {
      fail(r, how);
    } else if (r.restarts < options_.max_restarts) {
      ++r.restarts;
      r.state = RunState::kInterrupted;
      const double wait =
          std::min(options_.backoff_max,
                   options_.backoff_initial * double(1 << std::min(r.restarts - 1, 20)));
      retry_at_[index] = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(wait));
      r.error = how + ": " + last_error_line(run_dir + "/stderr.log");
      spdlog::warn("queue: {} {}; restarting it with --resume in {} s (restart {}/{}): {}", r.name,
                   how, wait, r.restarts, options_.max_restarts,
                   last_error_line(run_dir + "/stderr.log"));
    } else {
      fail(r, how + (options_.max_restarts > 0 ? ", restarts used up" : ""));
    }
    save();
  }

  /// The queue file's stop_command, once nothing is left to train (`code` 0 or 4): the runs'
  /// final checkpoints are in their directories by then, each run having waited for its own.
  void run_stop_command(int code) const {
    if (queue_.stop_command.empty()) return;
    spdlog::info("queue: stop_command ({}): {}",
                 code == kExitOk ? "every run finished" : "the runs left stopped at their budget",
                 queue_.stop_command);
    ::setenv("GPURUN_EXIT_CODE", std::to_string(code).c_str(), 1);
    const int status = std::system(queue_.stop_command.c_str());
    if (status != 0) spdlog::warn("queue: stop_command exited with status {}", status);
  }

  void fail(RunRecord& r, const std::string& how) {
    r.state = RunState::kFailed;
    const std::string log = run_dir_of(options_.dir, r.name) + "/stderr.log";
    const std::string line = last_error_line(log);
    r.error = how + (line.empty() ? "" : ": " + line);
    spdlog::error("queue: {} failed: {} (see {}); the other runs go on", r.name, r.error, log);
  }

  void forward_stop() {
    const int sig = stop_signal();
    state_.stopping = true;
    // SIGINT goes on as SIGTERM: a child that got two SIGINTs would stop without saving.
    const int forward = sig == SIGINT ? SIGTERM : sig;
    int running = 0;
    for (const Slot& s : slots_) {
      if (s.run < 0) continue;
      ::kill(-s.pid, forward);  // its process group: the run and any worker it started
      ++running;
    }
    spdlog::warn("queue: {} received; forwarding {} to {} running run(s), starting no other",
                 signal_name(sig), signal_name(forward), running);
    save();
  }

  const QueueFile& queue_;
  const QueueOptions& options_;
  std::ostream& out_;
  QueueState state_;
  std::vector<Slot> slots_;
  std::vector<Clock::time_point> retry_at_;
  std::vector<bool> held_;  ///< stopped on its own: left for the next invocation
  std::vector<std::string> devices_;
  unsigned threads_ = 1;
};

}  // namespace

int run_queue(const QueueFile& queue, const QueueOptions& options, std::ostream& out) {
  return QueueRunner(queue, options, out).run();
}

}  // namespace gpurun

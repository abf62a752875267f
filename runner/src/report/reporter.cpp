#include "report/reporter.h"

#include "report/file_writer.h"
#include "report/tensorboard_writer.h"
#include "util/detached_call.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>

#include <spdlog/sinks/sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "gpurun/errors.h"
#include "util/clock.h"
#include "util/fs.h"
#include "util/text.h"

namespace gpurun {

/// The progress line drawn in place on a terminal. Log lines are written around it: the line
/// is erased, the log line written, and the progress line drawn again below it.
class ProgressLine {
 public:
  void draw(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    text_ = text;
    open_ = true;
    std::fprintf(stderr, "\r\033[K%s", text_.c_str());
    std::fflush(stderr);
  }

  void erase() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_) {
      std::fputs("\r\033[K", stderr);
      std::fflush(stderr);
    }
    open_ = false;
  }

  template <class WriteLine>
  void around(WriteLine&& write_line) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_) {
      std::fputs("\r\033[K", stderr);
      std::fflush(stderr);
    }
    write_line();
    if (open_) {
      std::fputs(text_.c_str(), stderr);
      std::fflush(stderr);
    }
  }

 private:
  std::mutex mutex_;
  std::string text_;
  bool open_ = false;
};

namespace {

/// A console sink wrapped so that its lines go around the progress line.
class AroundProgressSink final : public spdlog::sinks::sink {
 public:
  AroundProgressSink(std::shared_ptr<spdlog::sinks::sink> inner, std::shared_ptr<ProgressLine> line)
      : inner_(std::move(inner)), line_(std::move(line)) {
    set_level(inner_->level());
  }
  void log(const spdlog::details::log_msg& msg) override {
    if (!inner_->should_log(msg.level)) return;
    line_->around([&] { inner_->log(msg); });
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }
  const std::shared_ptr<spdlog::sinks::sink>& inner() const { return inner_; }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
  std::shared_ptr<ProgressLine> line_;
};

bool writes_to_stderr(const std::shared_ptr<spdlog::sinks::sink>& sink) {
  using spdlog::details::console_mutex;
  return std::dynamic_pointer_cast<spdlog::sinks::ansicolor_stderr_sink<console_mutex>>(sink) ||
         std::dynamic_pointer_cast<spdlog::sinks::stderr_sink<console_mutex>>(sink);
}

}  // namespace

Reporter::Reporter(std::string run_dir, bool enabled, int rank)
    : run_dir_(std::move(run_dir)),
      enabled_(enabled),
      heartbeat_path_(heartbeat_path(run_dir_, rank)),
      // Under the supervisor stderr is a pipe to a terminal the supervisor holds.
      tty_(isatty(STDERR_FILENO) != 0 || std::getenv("GPURUN_STDERR_TTY") != nullptr),
      files_(std::make_unique<BackgroundFileWriter>()) {
  fs::make_dirs(run_dir_);
  if (enabled_)
    tensorboard_ = std::make_unique<TensorBoardWriter>(run_dir_ + "/tensorboard", *files_);
  status_["pid"] = static_cast<int64_t>(getpid());
  status_["host"] = host_name();
  if (enabled_ && tty_) {
    line_ = std::make_shared<ProgressLine>();
    for (auto& sink : spdlog::default_logger()->sinks()) {
      if (!writes_to_stderr(sink)) continue;
      original_sinks_.push_back(sink);
      sink = std::make_shared<AroundProgressSink>(sink, line_);
    }
  }
}

Reporter::~Reporter() {
  flush_heartbeat();
  // end_run() waited already when there was an end to record.
  files_->flush(ended_ ? 0.5 : 5);
  for (auto& sink : spdlog::default_logger()->sinks())
    if (auto wrapped = std::dynamic_pointer_cast<AroundProgressSink>(sink))
      for (const auto& original : original_sinks_)
        if (wrapped->inner() == original) sink = original;
}

void Reporter::event(const std::string& name, nlohmann::json fields) {
  const double now = unix_seconds();  // before the heartbeat's write, which may take a while
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  flush_heartbeat();
  if (!enabled_) return;
  nlohmann::json line = {{"event", name}, {"time", now}};
  line.update(fields);
  // A full, read-only or hung disk must not stop training over its log (the writer warns);
  // the checkpoints on it report their own failures (checkpoint.max_failures).
  // A path that is not UTF-8 (a directory named in Latin-1) is written with U+FFFD in place
  // of its bad bytes rather than stopping the run.
  files_->append_line(run_dir_ + "/metrics.jsonl",
                      line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  tensorboard_->record(line);
  if (observer_) observer_(name, line, status_);
}

void Reporter::write_file(const std::string& name, const std::string& data) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (enabled_) files_->replace_file(run_dir_ + "/" + name, data);
}

void Reporter::status(const nlohmann::json& fields, bool force) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  status_.update(fields);
  auto now = std::chrono::steady_clock::now();
  if (!enabled_ || (!force && now - last_status_ < std::chrono::seconds(10))) return;
  last_status_ = now;
  status_["updated"] = unix_seconds();
  files_->replace_file(
      run_dir_ + "/status.json",
      status_.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

bool Reporter::end_run(const nlohmann::json& done_fields, const nlohmann::json& status_fields) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (ended_) return false;
  ended_ = true;
  status_.update(status_fields);  // the done event's observer sees how the run ended
  event("done", done_fields);
  status(status_fields, true);
  flush_heartbeat();
  // 5 s for slow storage; 0.5 s for storage that already stopped answering, whose wait would
  // only add to a stop's time.
  const double wait = files_->seconds_behind() > 2 ? 0.5 : 5;
  if (!files_->flush(wait))
    spdlog::warn("the run directory {} did not take the run's last records within {:g} s", run_dir_,
                 wait);
  return true;
}

void Reporter::progress(const std::string& line, bool force) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  auto every = tty_ ? std::chrono::milliseconds(250) : std::chrono::milliseconds(10000);
  if (!force && last_progress_.time_since_epoch().count() != 0 && now - last_progress_ < every)
    return;
  last_progress_ = now;
  if (line_) {
    line_->draw(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }
}

void Reporter::heartbeat(int64_t global_step) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  heartbeat_step_ = global_step;
  auto now = std::chrono::steady_clock::now();
  if (now - last_heartbeat_ < std::chrono::seconds(1)) return;
  last_heartbeat_ = now;
  write_heartbeat();
}

void Reporter::flush_heartbeat() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (heartbeat_step_ >= 0 && heartbeat_step_ != written_step_) write_heartbeat();
}

void Reporter::write_heartbeat() {
  // On storage that hangs: none is started while one still hangs (the next carries the newest
  // step), and each is waited for a bounded time.
  if (heartbeat_write_ && !heartbeat_write_->wait_for(0)) return;
  written_step_ = heartbeat_step_;
  // Cheap: no fsync. Written beside and renamed over the file, so that a rank killed outright
  // (SIGKILL, the OOM killer) between the truncation and the write never leaves an empty file:
  // the launcher reads the step it reached, or the one before.
  // Waited for, not left to the background writer: a rank killed a moment later must leave
  // the step it reached for the launcher's report. At most once a second.
  const std::string text = "step " + std::to_string(heartbeat_step_) + "\n";
  heartbeat_write_ = DetachedCall<bool>::start([path = heartbeat_path_, text] {
    const std::string temporary = path + ".tmp";
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    return written && ::rename(temporary.c_str(), path.c_str()) == 0;
  });
  (void)heartbeat_write_->wait_for(kHeartbeatWaitSeconds);
}

std::string heartbeat_path(const std::string& run_dir, int rank) {
  return run_dir + (rank == 0 ? "/heartbeat" : "/heartbeat-rank-" + std::to_string(rank));
}

int64_t read_heartbeat_step(const std::string& path) {
  std::string text;
  try {
    text = fs::read_file(path);
  } catch (const std::exception&) {
    return -1;
  }
  if (!starts_with(text, "step ")) return -1;
  try {
    return std::stoll(text.substr(5));
  } catch (const std::exception&) {
    return -1;
  }
}

void Reporter::end_progress() {
  if (line_) line_->erase();
}

}  // namespace gpurun

#include "notify/notifier.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <spdlog/spdlog.h>

#include "gpurun/errors.h"
#include "notify/notice_message.h"
#include "util/clock.h"
#include "util/fs.h"
#include "util/http.h"

extern char** environ;

namespace gpurun {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr double kBackoffSeconds[] = {1, 2, 4, 8};
constexpr double kCommandSeconds = 30;
constexpr const char* kSentFile = "notify-sent.jsonl";

bool retryable(long status) {
  return status == 0 || status == 408 || status == 429 || status >= 500;
}

}  // namespace

std::string url_host(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return "(not a URL)";
  const size_t end = url.find_first_of("/?#", scheme + 3);
  std::string host = url.substr(0, end);
  // user:password@host: the password is a secret too.
  if (const size_t at = host.find('@', scheme + 3); at != std::string::npos)
    host = host.substr(0, scheme + 3) + host.substr(at + 1);
  return host;
}

Notifier::Notifier(const NotifyConfig& config, std::string run_dir, std::string run_name)
    : config_(config),
      run_dir_(std::move(run_dir)),
      run_name_(std::move(run_name)),
      host_(host_name()) {
  url_ = config_.url;
  if (!url_.empty() && url_[0] == '$') {
    const char* value = std::getenv(url_.c_str() + 1);
    if (!value || !*value)
      throw ConfigError("notify.url is " + url_ + ", and the environment variable " +
                        url_.substr(1) + " is not set");
    url_ = value;
  }
  if (!url_.empty()) {
    const bool http = url_.rfind("http://", 0) == 0 || url_.rfind("https://", 0) == 0;
    const std::string host = http ? url_host(url_).substr(url_.find("://") + 3) : "";
    if (!http || host.empty() || url_.find_first_of(" \t\r\n") != std::string::npos)
      throw ConfigError(
          "notify.url must be an http:// or https:// URL with a host and no spaces (its value is "
          "not shown: a webhook's URL may hold a secret)");
  }
  shown_ = url_.empty() ? "" : url_host(url_);
  if (url_.empty() && config_.command.empty()) return;
  if (!url_.empty()) http_ = std::make_unique<HttpClient>();
  thread_ = std::thread([this] { deliver_loop(); });
}

Notifier::~Notifier() {
  if (!thread_.joinable()) return;
  flush(kExitWaitSeconds);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (!queue_.empty() || busy_)
      spdlog::warn("notify: {} message(s) not delivered within {:.0f} s of the end; dropped",
                   queue_.size() + (busy_ ? 1 : 0), kExitWaitSeconds);
    queue_.clear();
  }
  changed_.notify_all();
  if (http_) http_->abort();
  thread_.join();
}

bool sends(const NotifyConfig& config, const std::string& event) {
  return (!config.url.empty() || !config.command.empty()) &&
         std::find(config.on.begin(), config.on.end(), event) != config.on.end();
}

bool Notifier::wants(const std::string& event) const {
  return thread_.joinable() && sends(config_, event);
}

void Notifier::send(const std::string& event, const json& status, const json& details,
                    const std::string& key) {
  if (!wants(event)) return;
  try {
    if (!key.empty() && delivered_before(key)) {
      spdlog::info("notify: `{}` was sent before (by an earlier process of this run); not again",
                   event);
      return;
    }
    json message = notice_message(event, run_name_, host_, status, details);
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(message), key});
  } catch (const std::exception& e) {
    spdlog::warn("notify: `{}` not sent: {}", event, e.what());
    return;
  }
  changed_.notify_all();
}

void Notifier::flush(double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, std::chrono::duration<double>(seconds),
                    [&] { return queue_.empty() && !busy_; });
}

void Notifier::deliver_loop() {
  // A command that does not read its stdin closes the pipe: EPIPE, not a SIGPIPE that would end
  // the process (a signal a write raises goes to the writing thread).
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  for (;;) {
    Pending p;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      p = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    const std::string event = p.message.value("event", std::string());
    bool ok = true;
    if (!url_.empty()) ok = post(p.message) && ok;
    if (!config_.command.empty()) ok = run_command(p.message) && ok;
    if (ok && !p.key.empty()) record(p.key, event);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    changed_.notify_all();
  }
}

bool Notifier::post(const json& message) {
  const std::string event = message.value("event", std::string());
  HttpRequest request;
  request.method = "POST";
  request.url = url_;
  request.headers = {"Content-Type: application/json"};
  request.body = message.dump();
  request.connect_seconds = 5;
  request.total_seconds = 10;
  request.proxy = true;
  std::string last;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    if (attempt > 0) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (changed_.wait_for(lock, std::chrono::duration<double>(kBackoffSeconds[attempt - 1]),
                            [&] { return stopping_; }))
        return false;
    }
    const HttpAnswer answer = http_->send(request);
    if (answer.status >= 200 && answer.status < 300) {
      if (attempt > 0)
        spdlog::info("notify: `{}` delivered to {} at try {}", event, shown_, attempt + 1);
      return true;
    }
    last = answer.status ? "HTTP " + std::to_string(answer.status) : answer.error;
    if (!retryable(answer.status)) break;
  }
  spdlog::warn("notify: `{}` could not be delivered to {} ({}); training goes on", event, shown_,
               last);
  return false;
}

bool Notifier::run_command(const json& message) {
  const std::string event = message.value("event", std::string());
  const std::string body = message.dump() + "\n";
  int in[2];
  if (::pipe2(in, O_CLOEXEC) != 0) {
    spdlog::warn("notify: notify.command not run for `{}`: pipe failed", event);
    return false;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(in[0]);
    ::close(in[1]);
    spdlog::warn("notify: notify.command not run for `{}`: fork failed", event);
    return false;
  }
  if (pid == 0) {
    ::dup2(in[0], STDIN_FILENO);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const char* argv[] = {"/bin/sh", "-c", config_.command.c_str(), nullptr};
    ::execve("/bin/sh", const_cast<char* const*>(argv), environ);
    ::_exit(127);
  }
  ::close(in[0]);
  size_t done = 0;
  while (done < body.size()) {
    const ssize_t n = ::write(in[1], body.data() + done, body.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(in[1]);
  const auto start = Clock::now();
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return false;
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      stopping = changed_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stopping_; });
    }
    if (stopping || seconds_since(start) > kCommandSeconds) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      if (stopping)
        spdlog::warn(
            "notify: notify.command for `{}` was still running {:.0f} s after it started, when "
            "the process ended (it waits up to {:.0f} s for its messages); killed",
            event, seconds_since(start), kExitWaitSeconds);
      else
        spdlog::warn("notify: notify.command for `{}` did not finish within {:.0f} s; killed",
                     event, kCommandSeconds);
      return false;
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  spdlog::warn("notify: notify.command for `{}` failed ({})", event,
               WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                 : "signal " + std::to_string(WTERMSIG(status)));
  return false;
}

bool Notifier::delivered_before(const std::string& key) {
  const std::string path = run_dir_ + "/" + kSentFile;
  if (!fs::exists(path)) return false;
  std::istringstream lines(fs::read_file(path));
  for (std::string line; std::getline(lines, line);) {
    const json entry = json::parse(line, nullptr, false);
    if (entry.is_object() && entry.value("key", std::string()) == key) return true;
  }
  return false;
}

void Notifier::record(const std::string& key, const std::string& event) {
  try {
    fs::make_dirs(run_dir_);
    fs::append_line(run_dir_ + "/" + kSentFile,
                    json{{"key", key}, {"event", event}, {"time", unix_seconds()}}.dump());
  } catch (const std::exception& e) {
    spdlog::warn("notify: could not record that `{}` was sent: {}", event, e.what());
  }
}

}  // namespace gpurun

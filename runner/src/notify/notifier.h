// Delivers a run's messages (notify/notice_message.h) to notify.url and notify.command from a
// background thread, so that training never waits for a webhook (README "Notifications"):
//
// - The URL gets a JSON POST (Content-Type: application/json), through the environment's
//   proxy, 5 s to connect and 10 s for the whole exchange. A 5xx, 408, 429, no answer or a
//   timeout is retried after 1, 2, 4 and 8 s (5 tries, as Slack's guidance and AWS's
//   exponential backoff); another 4xx is not. The command runs under /bin/sh with the JSON on
//   stdin and 30 s to finish (then SIGKILL).
// - Each message that fails for good is logged once, as a warning naming the event and the
//   webhook's host only: the URL may hold a secret (Slack's do), so it is never logged, nor
//   written to an event, status.json or an error.
// - Once across restarts: a message sent with a key is recorded in RUN_DIR/notify-sent.jsonl
//   once delivered, and a message whose key is recorded there is not sent again (a `finished`
//   sent before a kill is not sent again by the resumed process).
// - The destructor waits for the messages queued so far, at most kExitWaitSeconds: a
//   `finished` or `failed` sent as the process ends still goes out.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "gpurun/config.h"

namespace gpurun {

class HttpClient;

class Notifier {
 public:
  static constexpr double kExitWaitSeconds = 20;
  static constexpr int kTries = 5;

  /// Off (nothing sent, no thread) when config.url and config.command are both empty. A url of
  /// $NAME is read from the environment variable NAME. `run_dir` holds notify-sent.jsonl;
  /// `run_name` names the run in every message. Throws ConfigError when the URL is not http://
  /// or https:// (the message does not show it) or $NAME is not set.
  Notifier(const NotifyConfig& config, std::string run_dir, std::string run_name);
  ~Notifier();
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  /// Whether `event` is sent (on and listed in notify.on).
  bool wants(const std::string& event) const;

  /// Queues the message of `event` (notice_message() over `status` and `details`) unless it is
  /// not wanted or `key` is non-empty and recorded as delivered. Never throws, never waits.
  void send(const std::string& event, const nlohmann::json& status, const nlohmann::json& details,
            const std::string& key = "");

  /// Waits until every queued message is delivered or given up, at most `seconds`.
  void flush(double seconds);

  /// The run's name in messages: the last part of the run directory's path.
  const std::string& run_name() const { return run_name_; }

 private:
  struct Pending {
    nlohmann::json message;
    std::string key;
  };

  NotifyConfig config_;
  std::string url_;    ///< the resolved URL; never logged
  std::string shown_;  ///< its scheme and host, for messages
  std::string run_dir_;
  std::string run_name_;
  std::string host_;
  std::unique_ptr<HttpClient> http_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Pending> queue_;
  bool busy_ = false;      ///< the thread is delivering a message
  bool stopping_ = false;  ///< the destructor asked the thread to end
  std::thread thread_;

  void deliver_loop();
  bool post(const nlohmann::json& message);
  bool run_command(const nlohmann::json& message);
  bool delivered_before(const std::string& key);
  void record(const std::string& key, const std::string& event);
};

/// Whether `config` sends `event`: a URL or a command is set and notify.on lists it.
bool sends(const NotifyConfig& config, const std::string& event);

/// The scheme and host of `url` ("https://hooks.slack.com"): what a message may show of it.
std::string url_host(const std::string& url);

}  // namespace gpurun

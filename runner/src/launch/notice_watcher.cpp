#include "launch/notice_watcher.h"

#include <spdlog/spdlog.h>

#include "util/stop_notice.h"

namespace gpurun {
namespace {

std::string dmi_dir(const Environment& env) {
  const auto it = env.find(kDmiDirVariable);
  return it == env.end() || it->second.empty() ? kDmiDir : it->second;
}

Cloud named_cloud(const std::string& word) {
  if (word == "aws") return Cloud::kAws;
  if (word == "gcp") return Cloud::kGcp;
  if (word == "azure") return Cloud::kAzure;
  return Cloud::kNone;
}

}  // namespace

Cloud watched_cloud(const PreemptionConfig& config, const Environment& env) {
  if (config.watch != "auto") return named_cloud(config.watch);
  return cloud_of(read_dmi(dmi_dir(env)));
}

NoticeWatcher::NoticeWatcher(const PreemptionConfig& config, const Environment& env)
    : cloud_(watched_cloud(config, env)), poll_(config.poll_seconds) {
  const std::string why =
      config.watch == "auto" ? "DMI " + read_dmi(dmi_dir(env)).summary() : "preemption.watch";
  if (cloud_ == Cloud::kNone) {
    if (config.watch == "auto")
      spdlog::info(
          "preemption notices: not watched, this machine is on no cloud gpurun knows ({}); no "
          "metadata service is asked",
          why);
    return;
  }
  try {
    source_ = make_notice_source(cloud_, env, config.poll_seconds);
    http_ = std::make_unique<HttpClient>();
    thread_ = std::thread([this] { run(); });
  } catch (const std::exception& e) {
    // The run goes on without the notices rather than not at all: a signal still stops it.
    spdlog::warn("preemption notices: not watched ({}): {}", why, e.what());
    return;
  }
  spdlog::info("preemption notices: watching {} at {} every {:g} s ({})", cloud_name(cloud_),
               source_->endpoint(), config.poll_seconds, why);
}

NoticeWatcher::~NoticeWatcher() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  http_->abort();
  thread_.join();
}

void NoticeWatcher::run() {
  OnceLog log;
  for (;;) {
    const auto round = std::chrono::steady_clock::now();
    std::optional<StopNotice> notice;
    try {
      notice = source_->poll(*http_, log);
    } catch (const std::exception& e) {
      // Memory or a thread of curl's: the run goes on unwatched rather than ends.
      spdlog::warn("preemption notices: polling stopped: {}", e.what());
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) return;
    if (notice) {
      spdlog::warn(
          "preemption notice: {}; saving at the next step boundary, then stopping (exit 75: run "
          "again with --resume)",
          notice->describe());
      request_stop_for_notice(std::move(*notice));
      return;
    }
    // A round lasts poll_seconds, whatever its requests took (GCP's waits most of it).
    if (wake_.wait_until(lock, round + std::chrono::duration_cast<std::chrono::nanoseconds>(poll_),
                         [this] { return stopping_; }))
      return;
  }
}

}  // namespace gpurun

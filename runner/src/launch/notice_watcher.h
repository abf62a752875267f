// The thread that watches the cloud's preemption notices for a training process
// (preemption.watch, preemption.poll_seconds). On a notice it records it and requests a stop
// as SIGTERM would (util/stop_notice.h): the trainer saves at the next step boundary, wherever
// the checkpoint interval stands, gives the copy to the network tier the time the notice
// leaves, writes the `signal` event with the notice and exits 75; on Azure it acknowledges the
// event once the checkpoint is safe. Nothing but a notice read as its protocol says stops the
// run: every failure of the service (no answer, a timeout, a refusal, an error status, an
// answer that does not parse) is logged once and polling goes on.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "distributed/worker_env.h"
#include "gpurun/config.h"
#include "launch/cloud_detect.h"
#include "launch/notice_sources.h"
#include "util/http.h"

namespace gpurun {

/// preemption.watch resolved: the named cloud, none, or for auto the cloud of the DMI strings
/// in env's GPURUN_DMI_DIR (else /sys/class/dmi/id). Reads files only.
Cloud watched_cloud(const PreemptionConfig& config, const Environment& env);

class NoticeWatcher {
 public:
  /// Starts polling the metadata service of watched_cloud() every config.poll_seconds on a
  /// thread of its own, its endpoint from `env` (notice_sources.h), and logs what it watches;
  /// starts nothing (and sends no request) when that is Cloud::kNone. Never throws: when
  /// libcurl or the thread cannot start, it says so and watches nothing.
  NoticeWatcher(const PreemptionConfig& config, const Environment& env);
  /// Stops polling: a request in flight is aborted at once, the thread joined.
  ~NoticeWatcher();
  NoticeWatcher(const NoticeWatcher&) = delete;
  NoticeWatcher& operator=(const NoticeWatcher&) = delete;

  /// What is watched (Cloud::kNone: nothing).
  Cloud cloud() const { return cloud_; }

 private:
  void run();

  const Cloud cloud_;
  const std::chrono::duration<double> poll_;
  std::unique_ptr<NoticeSource> source_;
  std::unique_ptr<HttpClient> http_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;  ///< guarded by mutex_
  std::thread thread_;
};

}  // namespace gpurun

// The requests of each cloud's preemption protocol (launch/cloud_notices.h reads the answers):
// one round of polling per call, over a HttpClient, with whatever goes wrong logged once and
// never thrown. A bad answer never stops training: only a notice read as the protocol says does.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>

#include "distributed/worker_env.h"
#include "launch/cloud_detect.h"
#include "util/http.h"
#include "util/stop_notice.h"

namespace gpurun {

/// The endpoints, overridden as the clouds' own libraries let users do:
/// AWS_EC2_METADATA_SERVICE_ENDPOINT (the AWS SDKs' and CLI's setting: a URL) else
/// http://169.254.169.254; GCE_METADATA_HOST (google-auth's and the Go and Java clients':
/// host[:port]) else metadata.google.internal; Azure's SDKs have no setting for the metadata
/// service (AZURE_POD_IDENTITY_AUTHORITY_HOST names a token service, which answers nothing
/// else), so GPURUN_AZURE_METADATA_ENDPOINT (a URL) else http://169.254.169.254.
inline constexpr const char* kAwsEndpointVariable = "AWS_EC2_METADATA_SERVICE_ENDPOINT";
inline constexpr const char* kGcpHostVariable = "GCE_METADATA_HOST";
inline constexpr const char* kAzureEndpointVariable = "GPURUN_AZURE_METADATA_ENDPOINT";

/// Logs the watcher's troubles once each, so that a service that fails at every poll does not
/// fill the log: a failure once per request and kind (no answer, timed out, refused, another
/// status, a bad answer), a return to good answers once after a failure, a remark once per key.
class OnceLog {
 public:
  /// The request `what` got `answer`, which is not the protocol's good one.
  void failed(const std::string& what, const HttpAnswer& answer);
  /// The request `what` got an answer that does not follow the protocol (`why`).
  void bad_answer(const std::string& what, const std::string& why);
  /// The request `what` got a good answer.
  void answered(const std::string& what);
  /// `message` at info, once per `key`.
  void remark(const std::string& key, const std::string& message);

 private:
  void warn_once(const std::string& what, const std::string& kind, const std::string& message);
  std::set<std::string> logged_;   ///< what + kind, and remark keys
  std::set<std::string> failing_;  ///< requests whose last answer was a failure
};

class NoticeSource {
 public:
  virtual ~NoticeSource() = default;
  /// One round of requests: the notice to act on now, or nullopt.
  virtual std::optional<StopNotice> poll(HttpClient& http, OnceLog& log) = 0;
  /// The service's base URL, for the log.
  const std::string& endpoint() const { return base_; }

 protected:
  explicit NoticeSource(std::string base) : base_(std::move(base)) {}
  const std::string base_;
};

/// The source of `cloud` (not Cloud::kNone), its endpoint from `env`. GCP's source waits up
/// to `poll_seconds` (a whole second at least) for preempted to change
/// (`wait_for_change=true&timeout_sec=`), so that its 30 s notice is seen at once.
std::unique_ptr<NoticeSource> make_notice_source(Cloud cloud, const Environment& env,
                                                 double poll_seconds);

}  // namespace gpurun

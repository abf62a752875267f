#include "launch/notice_sources.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <functional>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "launch/cloud_notices.h"
#include "util/clock.h"

namespace gpurun {
namespace {

using Clock = std::chrono::steady_clock;
using Read = std::function<Reading(const std::string& body, double now)>;

std::string trimmed(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

std::string without_trailing_slash(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url;
}

std::string from_env(const Environment& env, const char* name, const std::string& fallback) {
  const auto it = env.find(name);
  return it == env.end() || it->second.empty() ? fallback : it->second;
}

/// The notice in a good answer of `what`, read by `read`; the answer's remarks are logged once.
/// A 404 is "nothing" where `missing_is_none` (AWS's spot action, before a notice); any other
/// answer than a 200 that reads is logged once and gives no notice.
std::optional<StopNotice> take(const std::string& what, const HttpAnswer& answer, OnceLog& log,
                               const Read& read, bool missing_is_none = false) {
  if (answer.status == 404 && missing_is_none) {
    log.answered(what);
    return std::nullopt;
  }
  if (answer.status != 200) {
    log.failed(what, answer);
    return std::nullopt;
  }
  if (answer.cut) {
    log.bad_answer(what, "longer than 1 MiB");
    return std::nullopt;
  }
  try {
    Reading reading = read(answer.body, unix_seconds());
    log.answered(what);
    for (const auto& [key, message] : reading.remarks) log.remark(key, message);
    return std::move(reading.notice);
  } catch (const BadAnswer& e) {
    log.bad_answer(what, e.what());
    return std::nullopt;
  }
}

/// IMDSv2: a session token (PUT /latest/api/token) on every request, fetched again before it
/// expires and whenever a request is refused with 401 (the service restarted, or the token
/// expired early).
class AwsSource final : public NoticeSource {
 public:
  explicit AwsSource(std::string base) : NoticeSource(std::move(base)) {}

  std::optional<StopNotice> poll(HttpClient& http, OnceLog& log) override {
    const std::string spot = "GET /latest/meta-data/spot/instance-action";
    std::optional<HttpAnswer> a = get(http, log, "/latest/meta-data/spot/instance-action");
    if (!a) return std::nullopt;
    if (std::optional<StopNotice> n = take(spot, *a, log, read_aws_spot_action, true)) return n;
    const std::string events = "GET /latest/meta-data/events/maintenance/scheduled";
    a = get(http, log, "/latest/meta-data/events/maintenance/scheduled");
    if (!a) return std::nullopt;
    return take(events, *a, log, read_aws_scheduled, true);
  }

 private:
  /// IMDSv2's longest token: 6 hours.
  static constexpr int kTokenSeconds = 21600;

  bool fetch_token(HttpClient& http, OnceLog& log) {
    const std::string what = "PUT /latest/api/token";
    HttpRequest r;
    r.method = "PUT";
    r.url = base_ + "/latest/api/token";
    r.headers = {"X-aws-ec2-metadata-token-ttl-seconds: " + std::to_string(kTokenSeconds)};
    const HttpAnswer a = http.send(r);
    token_ = a.status == 200 ? trimmed(a.body) : "";
    // A token goes into a header: printable ASCII only (IMDS's are base64).
    const bool printable = std::all_of(token_.begin(), token_.end(),
                                       [](unsigned char c) { return c > 0x20 && c < 0x7f; });
    if (token_.empty() || !printable) {
      if (a.status == 200)
        log.bad_answer(what, token_.empty() ? "an empty token" : "a token that is not text");
      else
        log.failed(what, a);
      token_.clear();
      return false;
    }
    log.answered(what);
    // A minute early: a token that expires between the check and the request costs a 401.
    token_expiry_ = Clock::now() + std::chrono::seconds(kTokenSeconds - 60);
    return true;
  }

  /// GET `path` with the token: nullopt when no token could be had (logged).
  std::optional<HttpAnswer> get(HttpClient& http, OnceLog& log, const std::string& path) {
    if ((token_.empty() || Clock::now() >= token_expiry_) && !fetch_token(http, log))
      return std::nullopt;
    HttpRequest r;
    r.url = base_ + path;
    r.headers = {"X-aws-ec2-metadata-token: " + token_};
    HttpAnswer a = http.send(r);
    if (a.status != 401) return a;
    if (!fetch_token(http, log)) return std::nullopt;
    r.headers = {"X-aws-ec2-metadata-token: " + token_};
    return http.send(r);
  }

  std::string token_;
  Clock::time_point token_expiry_;
};

/// GCP: every request with Metadata-Flavor: Google, and every answer must carry it too (the
/// Google libraries' test that the metadata server, not something else, answered).
class GcpSource final : public NoticeSource {
 public:
  GcpSource(std::string base, double poll_seconds)
      : NoticeSource(std::move(base)), wait_seconds_(std::max(1.0, std::ceil(poll_seconds))) {}

  std::optional<StopNotice> poll(HttpClient& http, OnceLog& log) override {
    const std::string preempted = "/computeMetadata/v1/instance/preempted";
    HttpRequest r = request(preempted);
    // Once the value's ETag is known, wait for it to change: a preemption is seen at once,
    // however long the poll interval.
    if (!etag_.empty()) {
      r.url += "?wait_for_change=true&timeout_sec=" + std::to_string(int(wait_seconds_)) +
               "&last_etag=" + etag_;
      r.total_seconds = wait_seconds_ + 3;
    }
    const HttpAnswer a = http.send(r);
    if (std::optional<StopNotice> n =
            take_from_google("GET " + preempted, a, log, read_gcp_preempted))
      return n;
    // Google's ETags are hex; anything else is not put into a query, and not waited on.
    const auto etag = a.headers.find("etag");
    etag_ = a.status == 200 && etag != a.headers.end() && !etag->second.empty() &&
                    std::all_of(etag->second.begin(), etag->second.end(),
                                [](unsigned char c) { return std::isalnum(c) != 0; })
                ? etag->second
                : "";
    const std::string maintenance = "/computeMetadata/v1/instance/maintenance-event";
    return take_from_google("GET " + maintenance, http.send(request(maintenance)), log,
                            read_gcp_maintenance);
  }

 private:
  HttpRequest request(const std::string& path) const {
    HttpRequest r;
    r.url = base_ + path;
    r.headers = {"Metadata-Flavor: Google"};
    return r;
  }

  static std::optional<StopNotice> take_from_google(const std::string& what, const HttpAnswer& a,
                                                    OnceLog& log, const Read& read) {
    const auto flavor = a.headers.find("metadata-flavor");
    if (a.status == 200 && (flavor == a.headers.end() || flavor->second != "Google")) {
      log.bad_answer(what,
                     "no Metadata-Flavor: Google in the answer: not Google's metadata server");
      return std::nullopt;
    }
    return take(what, a, log, read);
  }

  const double wait_seconds_;
  std::string etag_;  ///< of preempted's last answer; "" until one came
};

/// Azure: every request with Metadata: true. The machine's name (the Resources of the events
/// that are its own) is asked for until it is known; until then every event counts as ours.
class AzureSource final : public NoticeSource {
 public:
  explicit AzureSource(std::string base) : NoticeSource(std::move(base)) {}

  std::optional<StopNotice> poll(HttpClient& http, OnceLog& log) override {
    if (vm_name_.empty()) {
      const std::string path = "/metadata/instance/compute/name?api-version=2021-02-01&format=text";
      const HttpAnswer a = http.send(request(path));
      if (a.status == 200 && !trimmed(a.body).empty()) {
        vm_name_ = trimmed(a.body);
        log.answered("GET " + path);
      } else {
        log.failed("GET " + path, a);
      }
    }
    const std::string path = "/metadata/scheduledevents?api-version=2020-07-01";
    HttpRequest r = request(path);
    // The service starts at the first request for events and may take up to 2 minutes to
    // answer it (Scheduled Events' docs, "Enabling and disabling Scheduled Events").
    if (!events_answered_) r.total_seconds = 120;
    const HttpAnswer a = http.send(r);
    events_answered_ = events_answered_ || a.status == 200;
    std::optional<StopNotice> n =
        take("GET " + path, a, log, [this](const std::string& body, double now) {
          return read_azure_events(body, vm_name_, now);
        });
    if (n) n->acknowledge = acknowledger(base_ + path, n->event_id);
    return n;
  }

 private:
  HttpRequest request(const std::string& path) const {
    HttpRequest r;
    r.url = base_ + path;
    r.headers = {"Metadata: true"};
    return r;
  }

  /// POST {"StartRequests": [{"EventId": ID}]}: the event may start now, rather than at its
  /// NotBefore (Scheduled Events' docs, "Start an event").
  static std::function<void()> acknowledger(std::string url, std::string id) {
    return [url = std::move(url), id = std::move(id)] {
      try {
        HttpRequest r;
        r.method = "POST";
        r.url = url;
        r.headers = {"Metadata: true", "Content-Type: application/json"};
        r.body = nlohmann::json({{"StartRequests", {{{"EventId", id}}}}}).dump();
        r.total_seconds = 5;
        HttpClient http;
        const HttpAnswer a = http.send(r);
        if (a.status >= 200 && a.status < 300) {
          spdlog::info("preemption notice: acknowledged Azure event {}; the machine may go now",
                       id);
          return;
        }
        spdlog::warn(
            "preemption notice: Azure did not take the acknowledgement of event {} ({}); the "
            "event starts at its NotBefore instead",
            id, a.status ? "HTTP " + std::to_string(a.status) : a.error);
      } catch (const std::exception& e) {
        spdlog::warn("preemption notice: event {} not acknowledged: {}", id, e.what());
      }
    };
  }

  std::string vm_name_;
  bool events_answered_ = false;
};

}  // namespace

void OnceLog::failed(const std::string& what, const HttpAnswer& a) {
  if (a.status == 0 && a.error == "aborted") return;  // the watcher's own end
  failing_.insert(what);
  if (a.status == 0 && a.timed_out)
    warn_once(what, "timeout", "no answer in time (" + a.error + ")");
  else if (a.status == 0)
    warn_once(what, "no answer", a.error);
  else if (a.status == 400 || a.status == 401 || a.status == 403)
    warn_once(what, "refused",
              "refused with HTTP " + std::to_string(a.status) +
                  " (a header or token the service wants is missing or not taken)");
  else
    warn_once(what, "HTTP " + std::to_string(a.status), "HTTP " + std::to_string(a.status));
}

void OnceLog::bad_answer(const std::string& what, const std::string& why) {
  failing_.insert(what);
  warn_once(what, "bad answer", "an answer that is not the protocol's: " + why);
}

void OnceLog::answered(const std::string& what) {
  if (failing_.erase(what) && logged_.insert(what + "\nanswers").second)
    spdlog::info("preemption notices: {} answers as it should again", what);
}

void OnceLog::remark(const std::string& key, const std::string& message) {
  if (logged_.insert(key).second) spdlog::info("preemption notices: {}", message);
}

void OnceLog::warn_once(const std::string& what, const std::string& kind,
                        const std::string& message) {
  if (!logged_.insert(what + "\n" + kind).second) return;
  spdlog::warn(
      "preemption notices: {}: {}; training goes on (a notice is missed while this lasts), and "
      "this is logged once",
      what, message);
}

std::unique_ptr<NoticeSource> make_notice_source(Cloud cloud, const Environment& env,
                                                 double poll_seconds) {
  switch (cloud) {
    case Cloud::kAws:
      return std::make_unique<AwsSource>(
          without_trailing_slash(from_env(env, kAwsEndpointVariable, "http://169.254.169.254")));
    case Cloud::kGcp: {
      std::string host = from_env(env, kGcpHostVariable, "metadata.google.internal");
      if (host.find("://") == std::string::npos) host = "http://" + host;
      return std::make_unique<GcpSource>(without_trailing_slash(host), poll_seconds);
    }
    case Cloud::kAzure:
      return std::make_unique<AzureSource>(
          without_trailing_slash(from_env(env, kAzureEndpointVariable, "http://169.254.169.254")));
    case Cloud::kNone:
      break;
  }
  return nullptr;
}

}  // namespace gpurun

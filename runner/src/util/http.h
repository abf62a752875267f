// One HTTP(S) request at a time through libcurl, bounded by a connect and a total timeout, and
// abortable at once from another thread, so that the end of training never waits for a request
// in flight (curl's multi interface: curl_multi_poll() woken by curl_multi_wakeup(), libcurl
// 7.68 or newer). Used for an instance metadata service (AWS IMDS, GCP's metadata server, Azure
// IMDS; never through a proxy: the clouds' docs say the service answers on a link-local address
// that a proxy cannot reach, and a proxy must not see its tokens) and for the webhooks of
// notify.url (through the environment's proxy, as curl's own tool: a cluster's compute nodes
// often reach the internet through one).
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <vector>

namespace gpurun {

struct HttpRequest {
  std::string method = "GET";        ///< GET, PUT or POST
  std::string url;                   ///< http://host[:port]/path?query
  std::vector<std::string> headers;  ///< "Name: value"
  std::string body;                  ///< PUT and POST only
  double connect_seconds = 1;        ///< to connect, seconds
  double total_seconds = 3;          ///< for the whole exchange, seconds
  /// Use the proxy of http_proxy / https_proxy / no_proxy (libcurl's reading of them); false:
  /// never a proxy (a metadata service).
  bool proxy = false;
};

struct HttpAnswer {
  long status = 0;         ///< the HTTP status; 0 when no answer came (see error)
  std::string body;        ///< at most kMaxBodyBytes: a metadata answer is a few hundred bytes
  bool cut = false;        ///< the body was longer and is cut
  std::string error;       ///< when status is 0: curl's words ("Connection refused", ...)
  bool timed_out = false;  ///< no whole answer within the request's total_seconds
  std::map<std::string, std::string> headers;  ///< response headers, names in lower case
};

class HttpClient {
 public:
  static constexpr size_t kMaxBodyBytes = size_t{1} << 20;

  /// Throws std::runtime_error when libcurl cannot be initialised.
  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// Sends `request` and waits for its answer, its timeout or abort(); never throws for what
  /// the network or the server does (it is in the answer).
  HttpAnswer send(const HttpRequest& request);

  /// Ends a send() in flight within milliseconds and makes every later one return at once
  /// with error "aborted". Thread-safe.
  void abort();

 private:
  void* multi_;  ///< CURLM*, kept out of this header
  std::atomic<bool> aborted_{false};
};

}  // namespace gpurun

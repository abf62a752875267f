#include "util/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace gpurun {
namespace {

void init_curl() {
  static std::once_flag once;
  static CURLcode result = CURLE_OK;
  std::call_once(once, [] { result = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (result != CURLE_OK)
    throw std::runtime_error(std::string("curl_global_init: ") + curl_easy_strerror(result));
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* answer = static_cast<HttpAnswer*>(user);
  const size_t n = size * count;
  const size_t room =
      HttpClient::kMaxBodyBytes - std::min(answer->body.size(), HttpClient::kMaxBodyBytes);
  answer->body.append(data, std::min(n, room));
  if (n > room) answer->cut = true;
  return n;  // the rest is read and dropped: the connection stays in order
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* answer = static_cast<HttpAnswer*>(user);
  const size_t n = size * count;
  const std::string line(data, n);
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return n;  // the status line, or the blank line at the end
  std::string name = line.substr(0, colon);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const size_t begin = line.find_first_not_of(" \t", colon + 1);
  const size_t end = line.find_last_not_of(" \t\r\n");
  answer->headers[name] =
      begin == std::string::npos || end < begin ? "" : line.substr(begin, end - begin + 1);
  return n;
}

}  // namespace

HttpClient::HttpClient() {
  init_curl();
  multi_ = curl_multi_init();
  if (!multi_) throw std::runtime_error("curl_multi_init failed");
}

HttpClient::~HttpClient() { curl_multi_cleanup(static_cast<CURLM*>(multi_)); }

void HttpClient::abort() {
  aborted_ = true;
  curl_multi_wakeup(static_cast<CURLM*>(multi_));
}

HttpAnswer HttpClient::send(const HttpRequest& r) {
  HttpAnswer answer;
  if (aborted_) {
    answer.error = "aborted";
    return answer;
  }
  CURLM* multi = static_cast<CURLM*>(multi_);
  std::unique_ptr<CURL, void (*)(CURL*)> easy(curl_easy_init(), curl_easy_cleanup);
  curl_slist* list = nullptr;
  for (const std::string& h : r.headers) list = curl_slist_append(list, h.c_str());
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> headers(list, curl_slist_free_all);
  if (!easy) {
    answer.error = "curl_easy_init failed";
    return answer;
  }
  CURL* h = easy.get();
  curl_easy_setopt(h, CURLOPT_URL, r.url.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  if (!r.proxy) curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(h, CURLOPT_USERAGENT, "gpurun");
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(r.connect_seconds * 1000));
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(r.total_seconds * 1000));
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &answer);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &answer);
  if (r.method != "GET") {
    // POSTFIELDS sends the body with its Content-Length (0 for the token PUT's empty one).
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, static_cast<long>(r.body.size()));
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, r.body.c_str());
    if (r.method != "POST") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  if (curl_multi_add_handle(multi, h) != CURLM_OK) {
    answer.error = "curl_multi_add_handle failed";
    return answer;
  }
  CURLcode result = CURLE_OK;
  for (;;) {
    int running = 0;
    if (curl_multi_perform(multi, &running) != CURLM_OK) {
      result = CURLE_FAILED_INIT;
      break;
    }
    int left = 0;
    if (CURLMsg* msg = curl_multi_info_read(multi, &left); msg && msg->msg == CURLMSG_DONE) {
      result = msg->data.result;
      break;
    }
    if (aborted_) {
      result = CURLE_ABORTED_BY_CALLBACK;
      break;
    }
    // Wakes for the socket, curl's own timers, or abort()'s curl_multi_wakeup().
    curl_multi_poll(multi, nullptr, 0, 1000, nullptr);
  }
  curl_multi_remove_handle(multi, h);
  if (result == CURLE_OK) {
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &answer.status);
    return answer;
  }
  answer.status = 0;
  answer.timed_out = result == CURLE_OPERATION_TIMEDOUT;
  answer.error = result == CURLE_ABORTED_BY_CALLBACK ? "aborted" : curl_easy_strerror(result);
  return answer;
}

}  // namespace gpurun

#include "s3/s3_client.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <utility>

#include <curl/curl.h>
#include <libxml/parser.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include "s3/s3_xml.h"
#include "util/text.h"

namespace gpurun {
namespace {

constexpr int64_t kMinPartBytes = int64_t{5} << 20;   // S3's minimum part, except the last
constexpr int64_t kMaxPartBytes = int64_t{5} << 30;   // S3's maximum part
constexpr int kMaxParts = 10000;                      // S3's maximum parts per upload
constexpr int kMaxDeleteKeys = 1000;                  // S3's maximum keys per DeleteObjects
constexpr size_t kMaxAnswerBytes = size_t{64} << 20;  // a listing page is a few MB at most
constexpr size_t kMaxErrorBytes = size_t{1} << 20;    // beside a sink: an <Error> or a refusal
constexpr size_t kWholeBodyBytes = size_t{1} << 20;   // curl's EXPECT_100_THRESHOLD
constexpr double kFirstDelaySeconds = 0.1;
constexpr double kMaxDelaySeconds = 5;
// check_bucket() answers within 10 s: one attempt, bounded as a whole.
constexpr double kCheckSeconds = 8;
// CompleteMultipartUpload may take long on a big object while the server sends nothing.
constexpr double kCompleteStallSeconds = 120;
const char* const kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

void init_libraries() {
  static std::once_flag once;
  static CURLcode result = CURLE_OK;
  std::call_once(once, [] {
    result = curl_global_init(CURL_GLOBAL_DEFAULT);
    xmlInitParser();  // once, before threads parse (libxml2's thread-safety rule)
  });
  if (result != CURLE_OK)
    throw IoError(std::string("curl_global_init (") + curl_easy_strerror(result) + ")", "s3://",
                  EIO);
  // libcurl signs with the caller's x-amz-content-sha256 from 7.87 on; before, it hashed an
  // empty body for every streamed PUT and S3 would refuse each part's signature.
  const curl_version_info_data* version = curl_version_info(CURLVERSION_NOW);
  if (version->version_num < 0x075700)
    throw ConfigError(std::string("S3 checkpoints need libcurl 7.87 or newer (its SigV4 signing), "
                                  "this process has ") +
                      version->version);
}

// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters stay, everything else is
// %XX in upper case; '/' stays in a path and is encoded in a query value.
std::string uri_encode(const std::string& text, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size() * 3);
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// The query in SigV4's canonical form, which curl 7.88 signs exactly as written: parameters
// sorted by encoded name, names and values encoded, "name=" for a parameter without a value.
std::string canonical_query(const std::map<std::string, std::string>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  for (const auto& [name, value] : query)
    encoded.emplace_back(uri_encode(name, false), uri_encode(value, false));
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [name, value] : encoded) out += (out.empty() ? "" : "&") + name + "=" + value;
  return out;
}

std::string digest(const EVP_MD* md, const char* data, size_t bytes) {
  unsigned char hash[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data, bytes, hash, &length, md, nullptr) != 1)
    throw std::runtime_error("OpenSSL EVP_Digest failed");
  return std::string(reinterpret_cast<char*>(hash), length);
}

std::string hex(const std::string& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string base64(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string sha256_hex(const char* data, size_t bytes) {
  return hex(digest(EVP_sha256(), data, bytes));
}

std::string unquote(std::string etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"')
    etag = etag.substr(1, etag.size() - 2);
  return etag;
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// What a HEAD's error is called, having no body to name it (the names the AWS CLI prints).
std::string status_code_name(long status) {
  switch (status) {
    case 301:
      return "PermanentRedirect";
    case 400:
      return "BadRequest";
    case 403:
      return "Forbidden";
    case 404:
      return "NotFound";
    case 409:
      return "Conflict";
    case 412:
      return "PreconditionFailed";
    case 416:
      return "InvalidRange";
    case 429:
      return "TooManyRequests";
    case 500:
      return "InternalError";
    case 503:
      return "ServiceUnavailable";
    default:
      return status >= 300 ? "HTTP" + std::to_string(status) : "";
  }
}

bool transient_curl(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_HTTP2:
    case CURLE_PARTIAL_FILE:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

// One request as sent, the same for every attempt but for the Range of a resumed GET.
struct Request {
  const char* method = "GET";
  std::string key;  // "" for a request on the bucket
  std::map<std::string, std::string> query;
  std::vector<std::string> headers;  // "Name: value", each signed by curl
  const char* body = nullptr;        // PUT and POST
  size_t body_size = 0;
  std::string payload_hash = kEmptySha256;  // x-amz-content-sha256
  const ByteSink* sink = nullptr;  // where a 2xx answer's body goes (GET); else Outcome::body
  bool ranged = false;             // a GET with a Range: only a 206's body goes to the sink
  std::string label;               // for messages: " part 3", " bytes 0-99"
  double stall_seconds = 0;        // 0: Options::stall_seconds
  double total_seconds = 0;        // a bound on the whole attempt; 0: none
  double connect_seconds = 0;      // 0: Options::connect_timeout_seconds
};

// What one attempt got.
struct Outcome {
  CURLcode curl = CURLE_OK;
  std::string curl_error;
  long status = 0;
  std::map<std::string, std::string> headers;  // lowercased names
  std::string body;                            // unless streamed into the sink
  int64_t delivered = 0;                       // bytes handed to the sink
  std::exception_ptr sink_error;
  std::optional<s3xml::ErrorBody> error;  // of a non-2xx answer with an XML body
  int attempts = 1;
  double seconds = 0;

  bool ok() const { return curl == CURLE_OK && status >= 200 && status < 300; }
  bool answered(long s) const { return curl == CURLE_OK && status == s; }
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
  std::string code() const {
    if (curl != CURLE_OK) return "";
    if (error && !error->code.empty()) return error->code;
    return status_code_name(status);
  }
  bool transient() const {
    if (sink_error) return false;
    if (curl != CURLE_OK) return transient_curl(curl);
    return status >= 500 || status == 408 || status == 429 ||
           (status == 400 && code() == "RequestTimeout");
  }
};

// The state curl's callbacks share during one attempt.
struct Transfer {
  const Request* request;
  Outcome* outcome;
  double stall_seconds;
  size_t sent = 0;
  curl_off_t moved = -1;  // bytes sent and received when last seen
  std::chrono::steady_clock::time_point last_move = std::chrono::steady_clock::now();
  bool stalled = false;
};

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * count);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  if (starts_with(line, "HTTP/")) {  // a new answer: after "100 Continue", the real one
    size_t space = line.find(' ');
    t->outcome->status = space == std::string::npos ? 0 : std::atol(line.c_str() + space + 1);
    t->outcome->headers.clear();
  } else if (size_t colon = line.find(':'); colon != std::string::npos) {
    size_t begin = line.find_first_not_of(" \t", colon + 1);
    t->outcome->headers[lower(line.substr(0, colon))] =
        begin == std::string::npos ? "" : line.substr(begin);
  }
  return size * count;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  Outcome& o = *t->outcome;
  size_t bytes = size * count;
  const Request& r = *t->request;
  if (r.sink && (r.ranged ? o.status == 206 : o.status >= 200 && o.status < 300)) {
    try {
      (*t->request->sink)(data, bytes);
    } catch (...) {
      o.sink_error = std::current_exception();
      return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
    }
    o.delivered += static_cast<int64_t>(bytes);
    return bytes;
  }
  if (o.body.size() + bytes > (r.sink ? kMaxErrorBytes : kMaxAnswerBytes)) return 0;
  o.body.append(data, bytes);
  return bytes;
}

size_t on_read(char* buffer, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t n = std::min(size * count, t->request->body_size - t->sent);
  std::memcpy(buffer, t->request->body + t->sent, n);
  t->sent += n;
  return n;
}

int on_seek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > t->request->body_size)
    return CURL_SEEKFUNC_FAIL;
  t->sent = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

// Aborts a transfer that moved no byte for stall_seconds. curl's own low-speed limit (kept as a
// backstop) judges a 5-second average speed, so it fires only some 6 s after the last byte.
int on_progress(void* user, curl_off_t, curl_off_t received, curl_off_t, curl_off_t sent) {
  auto* t = static_cast<Transfer*>(user);
  auto now = std::chrono::steady_clock::now();
  if (received + sent != t->moved) {
    t->moved = received + sent;
    t->last_move = now;
    return 0;
  }
  if (std::chrono::duration<double>(now - t->last_move).count() < t->stall_seconds) return 0;
  t->stalled = true;
  return 1;  // CURLE_ABORTED_BY_CALLBACK
}

struct SlistFree {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

}  // namespace

S3Error::S3Error(std::string message, const std::string& path, int http_status, std::string code)
    : IoError("S3 request", path, EIO),
      message_(std::move(message)),
      http_status_(http_status),
      code_(std::move(code)) {}

struct S3Client::Impl {
  S3Client& client;
  std::string scheme, host, base_path;  // of the endpoint: "http", "127.0.0.1:7480", ""
  bool path_style;
  std::string sigv4;  // "aws:amz:REGION:s3"

  std::mutex handles_mutex;
  std::vector<CURL*> handles;  // idle easy handles, each keeping its connections

  explicit Impl(S3Client& c) : client(c) {
    const std::string& endpoint = c.settings_.endpoint;
    size_t scheme_end = endpoint.find("://");
    scheme = endpoint.substr(0, scheme_end);
    std::string rest = endpoint.substr(scheme_end + 3);
    size_t slash = rest.find('/');
    host = rest.substr(0, slash);
    base_path = slash == std::string::npos ? "" : rest.substr(slash);
    while (!base_path.empty() && base_path.back() == '/') base_path.pop_back();
    // A bucket name with dots breaks the certificate's wildcard in a virtual-host name.
    path_style =
        c.settings_.path_style || (scheme == "https" && c.bucket_.find('.') != std::string::npos);
    sigv4 = "aws:amz:" + c.settings_.region + ":s3";
  }

  ~Impl() {
    for (CURL* handle : handles) curl_easy_cleanup(handle);
  }

  const S3Client::Options& options() const { return client.options_; }

  // A message made safe to show: no secret in it, whatever a server or curl put there.
  std::string redact(std::string text) const {
    for (const std::string* secret :
         {&client.settings_.secret_access_key, &client.settings_.session_token}) {
      if (secret->empty()) continue;
      for (size_t at = text.find(*secret); at != std::string::npos; at = text.find(*secret, at + 8))
        text.replace(at, secret->size(), "[secret]");
    }
    return text;
  }

  std::string request_url(const Request& r) const {
    std::string path = uri_encode(r.key, true);
    std::string url = path_style
                          ? scheme + "://" + host + base_path + "/" + client.bucket_ +
                                (r.key.empty() ? "" : "/" + path)
                          : scheme + "://" + client.bucket_ + "." + host + base_path + "/" + path;
    if (!r.query.empty()) url += "?" + canonical_query(r.query);
    return url;
  }

  // "S3 PUT s3://bucket/key part 3" for messages: no query string.
  std::string describe_request(const Request& r) const {
    return std::string("S3 ") + r.method + " " + printable(client.url(r.key)) + r.label;
  }

  // "503 SlowDown (Please reduce your request rate.)", "no answer (Connection refused, curl
  // error 7)".
  std::string describe_outcome(const Outcome& o) const {
    if (o.curl != CURLE_OK) {
      std::string text = (o.status >= 200 ? std::to_string(o.status) + " cut short" : "no answer") +
                         std::string(" (") + o.curl_error + ", curl error " +
                         std::to_string(static_cast<int>(o.curl)) + ")";
      if (o.delivered > 0) text += " after " + std::to_string(o.delivered) + " bytes";
      return redact(text);
    }
    std::string text = std::to_string(o.status) + " " + o.code();
    if (o.error && !o.error->message.empty()) text += " (" + o.error->message + ")";
    if (std::string id = o.header("x-amz-request-id"); !id.empty()) text += " [request " + id + "]";
    return redact(text);
  }

  [[noreturn]] void fail(const Request& r, const Outcome& o, const std::string& detail = "") const {
    std::string message =
        describe_request(r) + ": " + (detail.empty() ? describe_outcome(o) : detail);
    if (o.attempts > 1)
      message += "; gave up after " + std::to_string(o.attempts) + " attempts in " +
                 fmt::format("{:.1f}", o.seconds) + " s";
    throw S3Error(redact(message), client.url(r.key),
                  o.curl == CURLE_OK ? static_cast<int>(o.status) : 0, o.code());
  }

  void require_ok(const Request& r, const Outcome& o) const {
    if (!o.ok()) fail(r, o);
  }

  // One attempt of `r`. Throws only for what the sink threw.
  Outcome perform(const Request& r) {
    CURL* handle = nullptr;
    {
      std::lock_guard<std::mutex> lock(handles_mutex);
      if (!handles.empty()) {
        handle = handles.back();
        handles.pop_back();
      }
    }
    if (!handle) handle = curl_easy_init();
    if (!handle) throw std::bad_alloc();
    // Back to the pool whatever happens; reset keeps its live connections.
    std::unique_ptr<CURL, std::function<void(CURL*)>> lease(handle, [this](CURL* h) {
      std::lock_guard<std::mutex> lock(handles_mutex);
      handles.push_back(h);
    });
    curl_easy_reset(handle);

    double stall = r.stall_seconds > 0 ? r.stall_seconds : options().stall_seconds;
    double connect = r.connect_seconds > 0 ? r.connect_seconds : options().connect_timeout_seconds;
    Outcome o;
    Transfer transfer{&r, &o, stall};
    char error_buffer[CURL_ERROR_SIZE] = "";
    const S3Settings& s = client.settings_;
    std::string url = request_url(r);

    std::unique_ptr<curl_slist, SlistFree> headers;
    auto add_header = [&headers](const std::string& line) {
      curl_slist* grown = curl_slist_append(headers.get(), line.c_str());
      if (!grown) throw std::bad_alloc();
      headers.release();
      headers.reset(grown);
    };
    // curl 7.88 hashes only CURLOPT_POSTFIELDS; given this header, it signs its value instead.
    add_header("x-amz-content-sha256: " + r.payload_hash);
    if (!s.session_token.empty()) add_header("x-amz-security-token: " + s.session_token);
    for (const std::string& line : r.headers) add_header(line);

    curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
    curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(handle, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
    curl_easy_setopt(handle, CURLOPT_PATH_AS_IS, 1L);  // keys may hold "." and ".." segments
    curl_easy_setopt(handle, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(handle, CURLOPT_USERNAME, s.access_key_id.c_str());
    curl_easy_setopt(handle, CURLOPT_PASSWORD, s.secret_access_key.c_str());
    curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(handle, CURLOPT_USERAGENT, "gpurun-s3");
    curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(connect * 1000));
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME, std::max(1L, std::lround(stall)));
    curl_easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(handle, CURLOPT_XFERINFODATA, &transfer);
    if (r.total_seconds > 0)
      curl_easy_setopt(handle, CURLOPT_TIMEOUT_MS, static_cast<long>(r.total_seconds * 1000));
    curl_easy_setopt(handle, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, error_buffer);
    curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(handle, CURLOPT_HEADERDATA, &transfer);
    curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(handle, CURLOPT_WRITEDATA, &transfer);

    std::string method = r.method;
    if (method == "HEAD") {
      curl_easy_setopt(handle, CURLOPT_NOBODY, 1L);
    } else if (method == "PUT" && r.body_size <= kWholeBodyBytes) {
      // Sent whole with the headers: curl 7.88 puts Expect: 100-continue on every upload (a
      // round trip more; a second's wait where a proxy ignores it), on a POSTFIELDS body only
      // past 1 MiB. The signature is the same: the method comes from CUSTOMREQUEST and the
      // payload hash from our header.
      curl_easy_setopt(handle, CURLOPT_POSTFIELDS, r.body ? r.body : "");
      curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body_size));
      curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, "PUT");
    } else if (method == "PUT") {
      curl_easy_setopt(handle, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(handle, CURLOPT_READFUNCTION, on_read);
      curl_easy_setopt(handle, CURLOPT_READDATA, &transfer);
      curl_easy_setopt(handle, CURLOPT_SEEKFUNCTION, on_seek);
      curl_easy_setopt(handle, CURLOPT_SEEKDATA, &transfer);
      curl_easy_setopt(handle, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body_size));
    } else if (method == "POST") {
      curl_easy_setopt(handle, CURLOPT_POST, 1L);
      curl_easy_setopt(handle, CURLOPT_POSTFIELDS, r.body ? r.body : "");
      curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body_size));
    } else if (method != "GET") {
      curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, r.method);
    }

    o.curl = curl_easy_perform(handle);
    if (o.sink_error) std::rethrow_exception(o.sink_error);
    if (transfer.stalled) {
      o.curl = CURLE_OPERATION_TIMEDOUT;
      o.curl_error = "stalled: no byte moved for " + fmt::format("{:g}", stall) + " s";
    } else if (o.curl != CURLE_OK) {
      o.curl_error = error_buffer[0] ? error_buffer : curl_easy_strerror(o.curl);
      // "Couldn't connect to server" alone does not say refused from unreachable.
      long os_errno = 0;
      curl_easy_getinfo(handle, CURLINFO_OS_ERRNO, &os_errno);
      std::string reason = os_errno ? std::strerror(static_cast<int>(os_errno)) : "";
      if (!reason.empty() && o.curl_error.find(reason) == std::string::npos)
        o.curl_error += ": " + reason;
    }
    long status = 0;
    curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &status);
    o.status = status;
    if (o.status >= 300) o.error = s3xml::parse_error(o.body);
    return o;
  }

  // The retry loop's state: the attempts made and when the deadline runs out.
  class Attempts {
   public:
    Attempts(const Impl& impl, const std::atomic<bool>* cancel = nullptr)
        : impl_(impl), cancel_(cancel), start_(std::chrono::steady_clock::now()), since_(start_) {}

    // After a failed attempt `o`: true, after on_retry and the backoff delay, when it is
    // transient and the deadline allows another; false when the caller should give up.
    // Records the attempts and seconds in `o` for the final message.
    bool again(const Request& r, Outcome& o) {
      auto now = std::chrono::steady_clock::now();
      o.attempts = attempt_;
      o.seconds = std::chrono::duration<double>(now - start_).count();
      if (!o.transient() || (cancel_ && cancel_->load())) return false;
      double ceiling = std::min(kMaxDelaySeconds, kFirstDelaySeconds * std::pow(2.0, attempt_ - 1));
      thread_local std::mt19937_64 random{std::random_device{}()};
      double delay = std::uniform_real_distribution<double>(0, ceiling)(random);
      double waited = std::chrono::duration<double>(now - since_).count();
      if (waited + delay > impl_.options().retry_seconds) return false;
      std::string message = impl_.describe_request(r) + ": " + impl_.describe_outcome(o) +
                            "; attempt " + std::to_string(attempt_) + " failed, retrying in " +
                            fmt::format("{:.2f}", delay) + " s";
      message = impl_.redact(message);
      if (impl_.options().on_retry)
        impl_.options().on_retry(message);
      else
        spdlog::warn("{}", message);
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      ++attempt_;
      return true;
    }
    // Bytes arrived: the deadline counts from now.
    void progress() { since_ = std::chrono::steady_clock::now(); }
    int attempt() const { return attempt_; }

   private:
    const Impl& impl_;
    const std::atomic<bool>* cancel_;
    std::chrono::steady_clock::time_point start_, since_;
    int attempt_ = 1;
  };

  // `r` retried until it succeeds, fails for good, or the deadline passes; the last outcome.
  Outcome execute(const Request& r, const std::atomic<bool>* cancel = nullptr) {
    Attempts attempts(*this, cancel);
    for (;;) {
      Outcome o = perform(r);
      if (o.ok() || !attempts.again(r, o)) return o;
    }
  }

  // Bytes [offset, offset + length) of `key` (length -1: to the end) into `out`, resumed after
  // a cut. Returns the ETag (no quotes) and the object's size.
  std::pair<std::string, int64_t> get_range(const std::string& key, int64_t offset, int64_t length,
                                            const ByteSink& out) {
    int64_t position = offset;
    int64_t end = length < 0 ? -1 : offset + length;  // exclusive; -1: the object's end
    std::string etag;
    int64_t size = -1;
    Attempts attempts(*this);
    for (;;) {
      // An attempt that failed after its last byte leaves nothing to resume.
      if (position > offset && ((end >= 0 && position >= end) || (end < 0 && position == size)))
        return {etag, size};
      Request r;
      r.key = key;
      r.sink = &out;
      bool ranged = position > 0 || end >= 0;
      r.ranged = ranged;
      if (ranged) {
        std::string range =
            std::to_string(position) + "-" + (end >= 0 ? std::to_string(end - 1) : "");
        r.headers.push_back("Range: bytes=" + range);
        r.label = " bytes " + range;
      }
      if (!etag.empty()) r.headers.push_back("If-Match: \"" + etag + "\"");
      Outcome o = perform(r);
      position += o.delivered;
      if (o.delivered > 0) attempts.progress();
      if (o.status >= 200 && o.status < 300) {
        if (ranged && o.status != 206)
          fail(r, o,
               "the server ignored the Range header (answered " + std::to_string(o.status) + ")");
        if (etag.empty()) etag = unquote(o.header("etag"));
        std::string content_range = o.header("content-range");  // "bytes 0-99/1234"
        size_t slash = content_range.find('/');
        if (slash != std::string::npos && content_range.compare(slash + 1, 1, "*") != 0) {
          size = std::stoll(content_range.substr(slash + 1));
        } else if (!ranged && !o.header("content-length").empty()) {
          size = offset + std::stoll(o.header("content-length"));
        }
      }
      if (o.ok()) {
        if (end >= 0 && position < end) {
          o.status = 416;
          fail(r, o,
               "object is " + std::to_string(size) + " bytes, shorter than the " +
                   std::to_string(end) + " bytes read");
        }
        return {etag, size};
      }
      if (o.answered(416) && position == offset && end < 0 && offset > 0) {
        // From the very end to the end is nothing, not an error. S3 answers 416 for it, some
        // servers (radosgw 16) without the Content-Range that gives the size: ask.
        std::string range = o.header("content-range");  // "bytes */1234"
        int64_t found = -1;
        if (starts_with(range, "bytes */")) {
          found = std::stoll(range.substr(8));
        } else if (std::optional<S3Object> object = client.head(key)) {
          found = object->size;
        }
        if (found == offset) return {etag, offset};
      }
      if (o.answered(412) && !etag.empty())
        fail(r, o, "the object changed while it was read (its ETag is no longer " + etag + ")");
      if (!attempts.again(r, o)) fail(r, o);
    }
  }
};

S3Client::S3Client(S3Settings settings, std::string bucket, Options options)
    : settings_(std::move(settings)), bucket_(std::move(bucket)), options_(std::move(options)) {
  auto bad = [](const std::string& what) { throw ConfigError("S3 client: " + what); };
  if (options_.part_bytes < kMinPartBytes || options_.part_bytes > kMaxPartBytes)
    bad("part_bytes must be 5 MiB to 5 GiB (S3's part sizes), got " +
        std::to_string(options_.part_bytes));
  if (options_.parts_in_flight < 1)
    bad("parts_in_flight must be >= 1, got " + std::to_string(options_.parts_in_flight));
  if (!(options_.retry_seconds >= 0)) bad("retry_seconds must be >= 0");
  if (!(options_.connect_timeout_seconds > 0)) bad("connect_timeout_seconds must be > 0");
  if (!(options_.stall_seconds >= 1)) bad("stall_seconds must be >= 1");
  if (options_.list_page_keys < 1 || options_.list_page_keys > 1000)
    bad("list_page_keys must be 1 to 1000, got " + std::to_string(options_.list_page_keys));
  if (bucket_.empty()) bad("no bucket");
  if (settings_.endpoint.find("://") == std::string::npos)
    bad("endpoint " + printable(settings_.endpoint) + " has no scheme");
  init_libraries();
  impl_ = std::make_unique<Impl>(*this);
}

S3Client::~S3Client() = default;

std::string S3Client::url(const std::string& key) const {
  return key.empty() ? "s3://" + bucket_ : "s3://" + bucket_ + "/" + key;
}

void S3Client::check_bucket() {
  Request r;
  r.query = {{"list-type", "2"}, {"max-keys", "1"}};
  r.total_seconds = kCheckSeconds;
  r.connect_seconds = std::min(options_.connect_timeout_seconds, kCheckSeconds / 2);
  Outcome o = impl_->perform(r);
  if (o.ok()) return;
  const std::string& endpoint = settings_.endpoint;
  auto fail = [this](const std::string& message) { throw ConfigError(impl_->redact(message)); };
  if (o.curl != CURLE_OK) {
    std::string why =
        o.curl == CURLE_OPERATION_TIMEDOUT
            ? "no answer within " + fmt::format("{:g}", kCheckSeconds) + " s: " + o.curl_error
            : o.curl_error;
    fail("S3 endpoint " + endpoint + " does not answer (" + why + ")");
  }
  std::string code = o.code();
  std::string detail = code + (o.error && !o.error->message.empty() ? ": " + o.error->message : "");
  std::string region =
      o.error && !o.error->region.empty() ? o.error->region : o.header("x-amz-bucket-region");
  if (!region.empty() && region != settings_.region)
    fail("S3 bucket " + bucket_ + " is in region " + region + ", not " + settings_.region +
         ": set AWS_REGION=" + region);
  if (o.status == 404 || code == "NoSuchBucket")
    fail("S3 bucket " + printable(bucket_) + " does not exist at " + endpoint + " (" + detail +
         ")");
  if (code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" || code == "InvalidToken" ||
      code == "ExpiredToken" || code == "TokenRefreshRequired" || code == "InvalidClientTokenId")
    fail("S3 credentials from " + settings_.credentials_source + " rejected by " + endpoint + " (" +
         detail + ")");
  if (code == "RequestTimeTooSkewed")
    fail("S3 endpoint " + endpoint + " refuses this machine's clock (" + detail +
         "): synchronise it (NTP)");
  if (o.status == 403)
    fail("S3 access to bucket " + printable(bucket_) + " at " + endpoint +
         " denied to the credentials from " + settings_.credentials_source + " (" + detail + ")");
  fail("S3 endpoint " + endpoint + " answered a listing of bucket " + printable(bucket_) +
       " with " + impl_->describe_outcome(o));
}

std::optional<S3Object> S3Client::head(const std::string& key) {
  Request r;
  r.method = "HEAD";
  r.key = key;
  Outcome o = impl_->execute(r);
  if (o.answered(404)) return std::nullopt;
  impl_->require_ok(r, o);
  S3Object object{key, 0, unquote(o.header("etag"))};
  try {
    object.size = std::stoll(o.header("content-length"));
  } catch (const std::exception&) {
    impl_->fail(r, o, "answer without a Content-Length");
  }
  return object;
}

S3Listing S3Client::list(const std::string& prefix, const std::string& delimiter) {
  S3Listing listing;
  std::string token;
  for (;;) {
    Request r;
    r.query = {{"list-type", "2"},
               {"encoding-type", "url"},
               {"max-keys", std::to_string(options_.list_page_keys)},
               {"prefix", prefix}};
    if (!delimiter.empty()) r.query["delimiter"] = delimiter;
    if (!token.empty()) r.query["continuation-token"] = token;
    r.label = " (list " + printable(prefix) + ")";
    Outcome o = impl_->execute(r);
    impl_->require_ok(r, o);
    s3xml::ListPage page;
    try {
      page = s3xml::parse_list_objects(o.body);
    } catch (const std::exception& e) {
      impl_->fail(r, o, std::string("unreadable answer: ") + e.what());
    }
    for (S3Object& object : page.objects) listing.objects.push_back(std::move(object));
    for (std::string& common : page.prefixes) listing.prefixes.push_back(std::move(common));
    if (!page.truncated) break;
    if (page.next_token.empty())
      impl_->fail(r, o, "truncated listing without a continuation token");
    token = page.next_token;
  }
  return listing;
}

void S3Client::get(const std::string& key, int64_t offset, int64_t length, const ByteSink& out) {
  if (offset < 0 || length < -1)
    throw std::invalid_argument("S3Client::get: offset " + std::to_string(offset) + ", length " +
                                std::to_string(length));
  if (length == 0) return;
  impl_->get_range(key, offset, length, out);
}

std::string S3Client::get(const std::string& key) {
  std::string bytes;
  impl_->get_range(key, 0, -1, [&bytes](const char* data, size_t n) { bytes.append(data, n); });
  return bytes;
}

void S3Client::download(const std::string& key, int64_t size, const ByteSink& out) {
  if (size < 0) throw std::invalid_argument("S3Client::download: size " + std::to_string(size));
  auto check_size = [&](int64_t found) {
    if (found != size)
      throw S3Error("S3 GET " + printable(url(key)) + ": object is " + std::to_string(found) +
                        " bytes, not the " + std::to_string(size) + " expected",
                    url(key), 200, "");
  };
  const int64_t part = options_.part_bytes;
  const int64_t parts = (size + part - 1) / part;
  if (parts <= 1 || options_.parts_in_flight == 1) {
    check_size(impl_->get_range(key, 0, size == 0 ? -1 : size, out).second);
    return;
  }

  // Worker w fetches parts w, w + n, w + 2n... into slot w, each once the previous part of
  // that slot was handed to `out`: at most n part buffers exist.
  const int n = static_cast<int>(std::min<int64_t>(options_.parts_in_flight, parts));
  struct Slot {
    std::string bytes;
    bool ready = false;
    std::string etag;
    int64_t size = 0;
  };
  std::vector<Slot> slots(static_cast<size_t>(n));
  std::mutex mutex;
  std::condition_variable changed;
  int64_t consumed = 0;
  bool stop = false;
  std::exception_ptr failure;

  auto worker = [&](int w) {
    for (int64_t k = w; k < parts; k += n) {
      Slot& slot = slots[static_cast<size_t>(w)];
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return stop || consumed + n > k; });
        if (stop) return;
      }
      try {
        slot.bytes.clear();
        int64_t length = std::min(part, size - k * part);
        slot.bytes.reserve(static_cast<size_t>(length));
        auto [etag, found] = impl_->get_range(
            key, k * part, length,
            [&slot](const char* data, size_t bytes) { slot.bytes.append(data, bytes); });
        std::lock_guard<std::mutex> lock(mutex);
        slot.etag = etag;
        slot.size = found;
        slot.ready = true;
        changed.notify_all();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failure) failure = std::current_exception();
        stop = true;
        changed.notify_all();
        return;
      }
    }
  };

  std::vector<std::thread> threads;
  for (int w = 0; w < n; ++w) threads.emplace_back(worker, w);
  auto finish = [&] {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
      changed.notify_all();
    }
    for (std::thread& t : threads) t.join();
  };
  try {
    std::string first_etag;
    for (int64_t k = 0; k < parts; ++k) {
      Slot& slot = slots[static_cast<size_t>(k % n)];
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return slot.ready || failure; });
        if (failure) break;
      }
      check_size(slot.size);
      if (k == 0) first_etag = slot.etag;
      if (slot.etag != first_etag)
        throw S3Error("S3 GET " + printable(url(key)) + ": the object changed during the download" +
                          " (ETag " + first_etag + ", then " + slot.etag + ")",
                      url(key), 412, "PreconditionFailed");
      out(slot.bytes.data(), slot.bytes.size());
      std::lock_guard<std::mutex> lock(mutex);
      slot.ready = false;
      ++consumed;
      changed.notify_all();
    }
  } catch (...) {
    finish();
    throw;
  }
  finish();
  if (failure) std::rethrow_exception(failure);
}

std::optional<std::string> S3Client::put(const std::string& key, const std::string& bytes,
                                         Condition condition, const std::string& etag) {
  std::string md5 = digest(EVP_md5(), bytes.data(), bytes.size());
  Request r;
  r.method = "PUT";
  r.key = key;
  r.body = bytes.data();
  r.body_size = bytes.size();
  r.payload_hash = sha256_hex(bytes.data(), bytes.size());
  r.headers = {"Content-MD5: " + base64(md5), "Content-Type: application/octet-stream"};
  if (condition == Condition::kIfAbsent) r.headers.push_back("If-None-Match: *");
  // Unquoted: radosgw 16 compares a PUT's If-Match with the bare ETag (a quoted one never
  // matches); AWS and MinIO take either form.
  if (condition == Condition::kIfMatch) r.headers.push_back("If-Match: " + unquote(etag));
  Impl::Attempts attempts(*impl_);
  bool retried = false;
  for (;;) {
    Outcome o = impl_->perform(r);
    if (o.ok()) return unquote(o.header("etag"));
    if (o.answered(412) || (o.answered(409) && o.code() == "ConditionalRequestConflict")) {
      // An earlier attempt may have written the object and lost its answer: then the object
      // holds these bytes, and the write was ours.
      if (retried) {
        std::optional<S3Object> now = head(key);
        if (now && now->size == static_cast<int64_t>(bytes.size()) && now->etag == hex(md5))
          return now->etag;
      }
      return std::nullopt;
    }
    if (!attempts.again(r, o)) impl_->fail(r, o);
    retried = true;
  }
}

namespace {

// The parts of one multipart upload in flight: filled by the caller's source, sent by
// parts_in_flight workers. Buffers are recycled, never more than parts_in_flight + 1.
class PartPipeline {
 public:
  /// Sends part `number`; returns its ETag. `cancel` turns true when the upload is abandoned.
  using Send = std::function<std::string(int number, const char* data, size_t bytes,
                                         const std::atomic<bool>& cancel)>;

  PartPipeline(size_t part_bytes, int in_flight, Send send)
      : part_bytes_(part_bytes), in_flight_limit_(in_flight), send_(std::move(send)) {
    for (int i = 0; i < in_flight; ++i) workers_.emplace_back([this] { work(); });
  }
  ~PartPipeline() { stop(true); }

  // Hands a full buffer over, blocking while parts_in_flight parts are queued or sending, and
  // returns an empty one. Rethrows a worker's failure.
  std::unique_ptr<char[]> push(std::unique_ptr<char[]> data, size_t bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return failure_ || in_flight_ < in_flight_limit_; });
    if (failure_) std::rethrow_exception(failure_);
    int number = static_cast<int>(etags_.size()) + 1;
    etags_.emplace_back();
    queue_.push_back(Part{number, std::move(data), bytes});
    ++in_flight_;
    changed_.notify_all();
    if (!spare_.empty()) {
      std::unique_ptr<char[]> buffer = std::move(spare_.back());
      spare_.pop_back();
      return buffer;
    }
    lock.unlock();
    return std::unique_ptr<char[]>(new char[part_bytes_]);
  }

  int parts() const { return static_cast<int>(etags_.size()); }

  // Waits for every part; their ETags in part order. Rethrows a worker's failure.
  std::vector<std::string> finish() {
    stop(false);
    if (failure_) std::rethrow_exception(failure_);
    return etags_;
  }

 private:
  struct Part {
    int number;
    std::unique_ptr<char[]> data;
    size_t bytes;
  };

  void stop(bool cancel) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
      if (cancel) cancelled_ = true;
      changed_.notify_all();
    }
    for (std::thread& t : workers_)
      if (t.joinable()) t.join();
  }

  void work() {
    for (;;) {
      Part part;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock,
                      [this] { return failure_ || cancelled_ || closing_ || !queue_.empty(); });
        if (failure_ || cancelled_ || queue_.empty()) return;
        part = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        std::string etag = send_(part.number, part.data.get(), part.bytes, cancelled_);
        std::lock_guard<std::mutex> lock(mutex_);
        etags_[static_cast<size_t>(part.number - 1)] = std::move(etag);
        spare_.push_back(std::move(part.data));
        --in_flight_;
        changed_.notify_all();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!failure_) failure_ = std::current_exception();
        changed_.notify_all();
        return;
      }
    }
  }

  const size_t part_bytes_;
  const int in_flight_limit_;
  Send send_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Part> queue_;
  std::vector<std::unique_ptr<char[]>> spare_;
  std::vector<std::string> etags_;  // as UploadPart returned them, quotes included
  int in_flight_ = 0;               // parts queued or being sent
  bool closing_ = false;
  std::atomic<bool> cancelled_{false};
  std::exception_ptr failure_;
  std::vector<std::thread> workers_;
};

}  // namespace

S3Object S3Client::upload(const std::string& key, const ByteSource& source) {
  const size_t part = static_cast<size_t>(options_.part_bytes);
  std::unique_ptr<char[]> current(new char[part]);
  size_t filled = 0;
  int64_t total = 0;
  std::string upload_id;
  std::unique_ptr<PartPipeline> pipeline;

  auto send_part = [this, &key, &upload_id](int number, const char* data, size_t bytes,
                                            const std::atomic<bool>& cancel) {
    Request r;
    r.method = "PUT";
    r.key = key;
    r.query = {{"partNumber", std::to_string(number)}, {"uploadId", upload_id}};
    r.body = data;
    r.body_size = bytes;
    r.payload_hash = "UNSIGNED-PAYLOAD";  // the server checks Content-MD5 instead
    r.headers = {"Content-MD5: " + base64(digest(EVP_md5(), data, bytes))};
    r.label = " part " + std::to_string(number);
    Outcome o = impl_->execute(r, &cancel);
    impl_->require_ok(r, o);
    std::string etag = o.header("etag");
    if (etag.empty()) impl_->fail(r, o, "UploadPart answered without an ETag");
    return etag;
  };

  auto start = [&] {
    Request r;
    r.method = "POST";
    r.key = key;
    r.query = {{"uploads", ""}};
    r.headers = {"Content-Type: application/octet-stream"};
    Outcome o = impl_->execute(r);
    impl_->require_ok(r, o);
    try {
      upload_id = s3xml::parse_upload_id(o.body);
    } catch (const std::exception& e) {
      impl_->fail(r, o, std::string("unreadable answer: ") + e.what());
    }
    pipeline = std::make_unique<PartPipeline>(part, options_.parts_in_flight, send_part);
  };

  auto push = [&] {
    if (!pipeline) start();
    if (pipeline->parts() >= kMaxParts)
      throw ConfigError("S3 upload " + printable(url(key)) + ": more than " +
                        std::to_string(kMaxParts) + " parts of " + std::to_string(part) +
                        " bytes, S3's limit: raise the part size");
    current = pipeline->push(std::move(current), filled);
    filled = 0;
  };

  try {
    source([&](const char* data, size_t bytes) {
      while (bytes > 0) {
        if (filled == part) push();  // only once more bytes come: the last part is never empty
        size_t n = std::min(bytes, part - filled);
        std::memcpy(current.get() + filled, data, n);
        filled += n;
        data += n;
        bytes -= n;
        total += static_cast<int64_t>(n);
      }
    });

    if (!pipeline) {  // at most one part: a plain PUT
      std::optional<std::string> etag = put(key, std::string(current.get(), filled));
      return S3Object{key, total, etag.value_or("")};
    }
    push();
    current.reset();
    std::vector<std::string> etags = pipeline->finish();

    Request r;
    r.method = "POST";
    r.key = key;
    r.query = {{"uploadId", upload_id}};
    std::string body = s3xml::complete_body(etags);
    r.body = body.data();
    r.body_size = body.size();
    r.payload_hash = sha256_hex(body.data(), body.size());
    r.headers = {"Content-Type: application/xml"};
    r.stall_seconds = std::max(options_.stall_seconds, kCompleteStallSeconds);
    r.label = " (complete " + std::to_string(etags.size()) + " parts)";
    // The object `key` when it is the upload just completed: its size, and an ETag of this
    // many parts ("HEX-N").
    auto completed = [&]() -> std::optional<S3Object> {
      std::optional<S3Object> done = head(key);
      std::string suffix = "-" + std::to_string(etags.size());
      if (done && done->size == total && done->etag.size() > suffix.size() &&
          done->etag.compare(done->etag.size() - suffix.size(), suffix.size(), suffix) == 0)
        return done;
      return std::nullopt;
    };
    Impl::Attempts attempts(*impl_);
    bool retried = false;
    for (;;) {
      Outcome o = impl_->perform(r);
      if (o.ok()) {
        // S3 may answer 200 and report an error in the body.
        if (std::optional<s3xml::ErrorBody> error = s3xml::parse_error(o.body)) {
          o.status = error->code == "InternalError" || error->code == "SlowDown" ? 500 : 400;
          o.error = error;
        } else {
          std::string etag;
          try {
            etag = s3xml::parse_complete_etag(o.body);
          } catch (const std::exception& e) {
            impl_->fail(r, o, std::string("unreadable answer: ") + e.what());
          }
          if (!etag.empty()) return S3Object{key, total, etag};
          // radosgw 16 answers <ETag></ETag>: the object has one, HEAD tells it.
          if (std::optional<S3Object> done = completed()) return *done;
          impl_->fail(r, o,
                      "completed, but the object is not there as " + std::to_string(etags.size()) +
                          " parts of " + std::to_string(total) + " bytes");
        }
      }
      if (retried && o.answered(404) && o.code() == "NoSuchUpload") {
        // An earlier attempt completed it and its answer was lost.
        if (std::optional<S3Object> done = completed()) return *done;
      }
      if (!attempts.again(r, o)) impl_->fail(r, o);
      retried = true;
    }
  } catch (...) {
    pipeline.reset();  // stops the workers (cancelled) before the abort
    if (!upload_id.empty()) {
      try {
        abort_multipart_upload(S3Upload{key, upload_id});
      } catch (const std::exception& e) {
        spdlog::warn(
            "{} (after a failed upload; the incomplete upload keeps its parts until "
            "aborted or expired by a lifecycle rule)",
            e.what());
      }
    }
    throw;
  }
}

void S3Client::remove(const std::string& key) {
  Request r;
  r.method = "DELETE";
  r.key = key;
  Outcome o = impl_->execute(r);
  if (o.answered(404)) return;
  impl_->require_ok(r, o);
}

void S3Client::remove(const std::vector<std::string>& keys) {
  std::vector<std::string> batch;
  auto flush = [&] {
    if (batch.empty()) return;
    std::string body = s3xml::delete_body(batch);
    Request r;
    r.method = "POST";
    r.query = {{"delete", ""}};
    r.body = body.data();
    r.body_size = body.size();
    r.payload_hash = sha256_hex(body.data(), body.size());
    r.headers = {"Content-MD5: " + base64(digest(EVP_md5(), body.data(), body.size())),
                 "Content-Type: application/xml"};
    r.label = " (delete " + std::to_string(batch.size()) + " keys)";
    Outcome o = impl_->execute(r);
    impl_->require_ok(r, o);
    std::vector<s3xml::DeleteFailure> failures;
    try {
      failures = s3xml::parse_delete_result(o.body);
    } catch (const std::exception& e) {
      impl_->fail(r, o, std::string("unreadable answer: ") + e.what());
    }
    for (const s3xml::DeleteFailure& f : failures) {
      if (f.code == "NoSuchKey") continue;
      throw S3Error(impl_->redact("S3 DeleteObjects " + printable(url(f.key)) + ": " + f.code +
                                  (f.message.empty() ? "" : " (" + f.message + ")")),
                    url(f.key), static_cast<int>(o.status), f.code);
    }
    batch.clear();
  };
  for (const std::string& key : keys) {
    if (!s3xml::xml_safe(key)) {  // XML 1.0 cannot name it: one DELETE of its own
      remove(key);
      continue;
    }
    batch.push_back(key);
    if (static_cast<int>(batch.size()) == kMaxDeleteKeys) flush();
  }
  flush();
}

std::vector<S3Upload> S3Client::list_multipart_uploads(const std::string& prefix) {
  std::vector<S3Upload> uploads;
  std::string key_marker, id_marker;
  for (;;) {
    Request r;
    r.query = {{"uploads", ""},
               {"encoding-type", "url"},
               {"max-uploads", std::to_string(options_.list_page_keys)},
               {"prefix", prefix}};
    if (!key_marker.empty()) r.query["key-marker"] = key_marker;
    if (!id_marker.empty()) r.query["upload-id-marker"] = id_marker;
    r.label = " (list uploads " + printable(prefix) + ")";
    Outcome o = impl_->execute(r);
    impl_->require_ok(r, o);
    s3xml::UploadsPage page;
    try {
      page = s3xml::parse_list_uploads(o.body);
    } catch (const std::exception& e) {
      impl_->fail(r, o, std::string("unreadable answer: ") + e.what());
    }
    for (S3Upload& upload : page.uploads) uploads.push_back(std::move(upload));
    if (!page.truncated) break;
    if (page.next_key_marker.empty() && page.next_upload_id_marker.empty())
      impl_->fail(r, o, "truncated listing without a marker");
    key_marker = page.next_key_marker;
    id_marker = page.next_upload_id_marker;
  }
  return uploads;
}

void S3Client::abort_multipart_upload(const S3Upload& upload) {
  Request r;
  r.method = "DELETE";
  r.key = upload.key;
  r.query = {{"uploadId", upload.upload_id}};
  r.label = " (abort upload)";
  Outcome o = impl_->execute(r);
  if (o.answered(404)) return;
  impl_->require_ok(r, o);
}

}  // namespace gpurun

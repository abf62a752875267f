// An S3 client for the object-storage checkpoint backend (`--ckpt s3://BUCKET/PREFIX`): the
// handful of calls a checkpoint needs, each retried, with parallel multipart uploads and
// ranged downloads whose host memory stays bounded whatever the object's size.
//
// Requests are signed by libcurl (CURLOPT_AWS_SIGV4). curl 7.88 signs the query string as it
// is written and hashes only CURLOPT_POSTFIELDS bodies, so every query is built here in SigV4's
// canonical form (keys sorted, RFC 3986 encoded), every object key is encoded the way S3
// decodes it, and every request carries its own x-amz-content-sha256 (which curl then signs):
// the SHA-256 of an in-memory body, or UNSIGNED-PAYLOAD for multipart parts, whose integrity
// comes from Content-MD5, which the server checks before storing the part.
//
// Retries: a request that failed with a 5xx, 408, 429, S3's 400 RequestTimeout, or a transport
// error (refused, reset, cut short, timed out, or stalled: no byte moved for
// Options::stall_seconds) is sent again after a delay drawn uniformly from
// [0, min(5 s, 0.1 s x 2^(n-1))] before the n-th retry ("full jitter", AWS Architecture Blog,
// "Exponential Backoff And Jitter", 2015), until Options::retry_seconds have passed. Any other
// 4xx is an answer and is never retried (a 412 means a condition failed). A retried POST that
// starts a multipart upload may leave the first attempt's upload behind, unseen:
// list_multipart_uploads() finds such leftovers (as does a bucket lifecycle rule's
// AbortIncompleteMultipartUpload).
//
// Secrets: the secret key, the session token and request signatures never appear in a log line,
// an exception's message or on_retry's text; messages name the method, s3://BUCKET/KEY, the
// HTTP status, S3's error code and message, and curl's error.
//
// Thread-safety: every method may be called from several threads at once. Each request borrows
// a curl handle of the client's own (one per thread in flight), so connections are reused
// across requests, threads and calls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpurun/errors.h"
#include "s3/s3_settings.h"
#include "util/byte_sink.h"

namespace gpurun {

/// An object as a listing or HEAD describes it.
struct S3Object {
  std::string key;
  int64_t size = 0;  ///< bytes
  /// Without quotes: the hex MD5 of a single-PUT object, "HEX-N" for one of N parts.
  std::string etag;
};

/// What list() found under a prefix.
struct S3Listing {
  std::vector<S3Object> objects;      ///< in key order (UTF-8 binary order)
  std::vector<std::string> prefixes;  ///< with a delimiter: the common prefixes, delimiter included
};

/// A multipart upload that was started and neither completed nor aborted (its parts are
/// stored, and billed, until it is aborted).
struct S3Upload {
  std::string key;
  std::string upload_id;
};

/// An S3 request that failed for good: after its retries, or at once for an answer that
/// retrying cannot change (403, 404, 400...). An IoError with errno EIO and path
/// "s3://BUCKET/KEY", so that handling of storage errors applies to it as to a file's.
class S3Error : public IoError {
 public:
  /// `message` is the whole text what() returns; `path` "s3://BUCKET/KEY".
  S3Error(std::string message, const std::string& path, int http_status, std::string code);
  const char* what() const noexcept override { return message_.c_str(); }
  /// The HTTP status of the last answer; 0 when none came (a transport error).
  int http_status() const noexcept { return http_status_; }
  /// S3's error code ("NoSuchKey", "SlowDown", "AccessDenied"); for a HEAD, which has no body,
  /// one named after the status ("NotFound", "Forbidden"); "" for a transport error.
  const std::string& code() const noexcept { return code_; }

 private:
  std::string message_;
  int http_status_;
  std::string code_;
};

/// How S3Client sends its requests (S3Client::Options).
struct S3ClientOptions {
  /// Multipart part size and ranged-GET size, bytes: 5 MiB (S3's minimum part, except the
  /// last) to 5 GiB. An upload has at most 10000 parts, so this caps an object at 10000 x it
  /// (78 GiB for 8 MiB).
  int64_t part_bytes = 8 << 20;
  int parts_in_flight = 4;     ///< parallel part uploads / ranged GETs, >= 1
  double retry_seconds = 120;  ///< a request is retried until this many seconds have passed
  double connect_timeout_seconds = 5;
  /// A transfer that moves no byte for this long (sending, or waiting for an answer) is
  /// aborted and retried, >= 1. (curl's low-speed limit of 1 byte/s over this time stays as
  /// a backstop.)
  double stall_seconds = 20;
  /// Keys per ListObjectsV2 / ListMultipartUploads page, 1 to 1000 (S3's maximum); smaller
  /// only to test paging.
  int list_page_keys = 1000;
  /// Told of each retry, once, before its delay: "S3 PUT s3://b/k part 3: 503 SlowDown
  /// (...); attempt 1 failed, retrying in 0.37 s". Called from the thread that made the
  /// request: from several at once during upload() and download(). Default: spdlog::warn.
  std::function<void(const std::string& message)> on_retry;
};

class S3Client {
 public:
  using Options = S3ClientOptions;
  using Upload = S3Upload;

  /// A client of `bucket` at settings.endpoint. Throws ConfigError for options out of range
  /// or a libcurl older than 7.87 (whose SigV4 cannot sign a streamed body). Makes no request
  /// (check_bucket() does).
  S3Client(S3Settings settings, std::string bucket, Options options = {});
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const std::string& bucket() const noexcept { return bucket_; }
  const S3Settings& settings() const noexcept { return settings_; }
  /// "s3://BUCKET/KEY", as messages and S3Error::path() name an object.
  std::string url(const std::string& key) const;

  /// The start-up check that the endpoint answers, the credentials are accepted and the bucket
  /// exists: one ListObjectsV2 of at most 1 key, with no retry loop, done within 10 s. Throws
  /// ConfigError with the cause: "S3 credentials from SOURCE rejected by ENDPOINT
  /// (InvalidAccessKeyId)" (or SignatureDoesNotMatch, AccessDenied...), "S3 bucket B does not
  /// exist at ENDPOINT", "S3 bucket B is in region R, not X", "S3 endpoint ENDPOINT does not
  /// answer (connection refused)" (or a timeout, an unknown host, a TLS failure).
  void check_bucket();

  /// The object `key`'s size and ETag; nullopt when it does not exist. Throws S3Error.
  std::optional<S3Object> head(const std::string& key);

  /// Every object whose key starts with `prefix` (all pages of ListObjectsV2). With a
  /// `delimiter` ("/"), keys that have it after the prefix are grouped into `prefixes` instead,
  /// as a directory listing. Throws S3Error.
  S3Listing list(const std::string& prefix, const std::string& delimiter = "");

  /// Bytes [offset, offset + length) of `key` (length -1: to the end) handed to `out` in order,
  /// as they arrive. A transfer cut short (reset, short body, stall) resumes with a Range from
  /// the first byte not yet received, pinned to the first answer's ETag (If-Match), so a resumed
  /// read never splices two versions of the object; the retry deadline restarts whenever bytes
  /// arrived. Throws S3Error (NoSuchKey: http_status 404; an object replaced meanwhile: 412
  /// PreconditionFailed; one shorter than offset + length: 416 InvalidRange), or what `out`
  /// throws.
  void get(const std::string& key, int64_t offset, int64_t length, const ByteSink& out);
  /// The whole object `key` in memory (small objects: manifests, markers). Throws S3Error.
  std::string get(const std::string& key);

  /// The whole object `key`, of `size` bytes (from head() or list()), handed to `out` in order,
  /// fetched with up to parts_in_flight ranged GETs of part_bytes at once; host memory stays
  /// below parts_in_flight x part_bytes. Throws S3Error, also when the object is not `size`
  /// bytes or changed during the download (its parts' ETags differ), or what `out` throws.
  void download(const std::string& key, int64_t size, const ByteSink& out);

  /// Conditions of put(): S3's conditional writes (2024), which make a PUT a compare-and-swap.
  enum class Condition {
    kNone,
    kIfAbsent,  ///< If-None-Match: *  (create only)
    kIfMatch,   ///< If-Match: ETAG    (replace only that version)
  };
  /// One PUT of `bytes` with Content-MD5 and a signed SHA-256; `etag` (kIfMatch: with or
  /// without quotes) as head() or put() returned it. Returns the new object's ETag
  /// (no quotes), or nullopt when `condition` failed (412 PreconditionFailed, or 409
  /// ConditionalRequestConflict from a concurrent conditional write). A retry that meets 412
  /// after an attempt whose answer was lost checks with HEAD whether the object now holds these
  /// very bytes (its ETag is their MD5), and then returns that ETag. Throws S3Error.
  std::optional<std::string> put(const std::string& key, const std::string& bytes,
                                 Condition condition = Condition::kNone,
                                 const std::string& etag = "");

  /// Writes what `source` produces to `key`. `source` is called once and may hand its sink
  /// pieces of any size. Bytes are gathered into part_bytes buffers and sent as a multipart
  /// upload, parts_in_flight parts at once, each with Content-MD5 and retried from its own
  /// buffer; while all parts are in flight the sink blocks, so host memory stays near
  /// (parts_in_flight + 1) x part_bytes whatever the object's size. An object of at most
  /// part_bytes is one PUT. Any failure (of a part, of `source`, of completion) aborts the
  /// multipart upload, best effort, and is rethrown. Returns the object (key, size, ETag; the
  /// ETag from a HEAD when the server's completion answer lacks it, as radosgw 16's does).
  /// Throws S3Error, ConfigError for an object past 10000 parts, or what `source` throws.
  S3Object upload(const std::string& key, const ByteSource& source);

  /// Deletes `key`; an absent key is fine. Throws S3Error.
  void remove(const std::string& key);
  /// Deletes `keys` with DeleteObjects, 1000 per request (with the Content-MD5 it requires);
  /// absent keys are fine. Throws S3Error naming the first key that could not be deleted.
  void remove(const std::vector<std::string>& keys);

  /// The multipart uploads under `prefix` not yet completed or aborted (all pages).
  std::vector<S3Upload> list_multipart_uploads(const std::string& prefix);
  /// Aborts `upload`, freeing its parts; one already gone is fine. Throws S3Error.
  void abort_multipart_upload(const S3Upload& upload);

 private:
  struct Impl;
  S3Settings settings_;
  std::string bucket_;
  Options options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpurun

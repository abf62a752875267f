// The XML of S3's REST API (https://docs.aws.amazon.com/AmazonS3/latest/API/), read with
// libxml2 and written by hand: the answers S3Client parses and the two bodies it sends.
// Elements are matched by local name, whatever their namespace, since S3-compatible servers
// differ in the xmlns they declare. Documents are parsed without network access or entity
// expansion.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "s3/s3_client.h"

namespace gpurun::s3xml {

/// An <Error> answer. Only these fields are kept: others (StringToSign, CanonicalRequest,
/// SignatureProvided) may echo signed headers, the session token among them.
struct ErrorBody {
  std::string code;     ///< "NoSuchKey"
  std::string message;  ///< "The specified key does not exist."
  std::string region;   ///< the bucket's region, in a wrong-region answer
};

/// The <Error> document `xml` holds (also inside a 200 answer to CompleteMultipartUpload);
/// nullopt when it holds none or is not XML.
std::optional<ErrorBody> parse_error(const std::string& xml);

/// One page of ListObjectsV2.
struct ListPage {
  std::vector<S3Object> objects;
  std::vector<std::string> prefixes;
  bool truncated = false;
  std::string next_token;  ///< NextContinuationToken
};
/// Keys and prefixes are URL-decoded when the answer says EncodingType "url" (requested, since
/// XML 1.0 cannot carry every byte a key may hold). Throws std::runtime_error when `xml` is not
/// a ListBucketResult.
ListPage parse_list_objects(const std::string& xml);

/// One page of ListMultipartUploads.
struct UploadsPage {
  std::vector<S3Upload> uploads;
  bool truncated = false;
  std::string next_key_marker, next_upload_id_marker;
};
/// Throws std::runtime_error when `xml` is not a ListMultipartUploadsResult.
UploadsPage parse_list_uploads(const std::string& xml);

/// The UploadId of an InitiateMultipartUploadResult. Throws std::runtime_error when absent.
std::string parse_upload_id(const std::string& xml);

/// The ETag (quotes removed) of a CompleteMultipartUploadResult. Throws std::runtime_error
/// when `xml` is not one (check parse_error() first: S3 may answer 200 with an <Error>).
std::string parse_complete_etag(const std::string& xml);

/// A key that DeleteObjects could not delete.
struct DeleteFailure {
  std::string key, code, message;
};
/// The <Error> entries of a DeleteResult (quiet mode lists only those).
std::vector<DeleteFailure> parse_delete_result(const std::string& xml);

/// The CompleteMultipartUpload body: `etags[i]` is part i + 1's ETag as UploadPart returned it.
std::string complete_body(const std::vector<std::string>& etags);

/// The DeleteObjects body for `keys`, in quiet mode (only failures are answered).
std::string delete_body(const std::vector<std::string>& keys);

/// Whether every byte of `key` can be written in XML 1.0 (no control character other than
/// tab, newline and carriage return), so that DeleteObjects can name it.
bool xml_safe(const std::string& key);

/// `text` decoded from application/x-www-form-urlencoded ("%2F" -> '/', '+' -> ' '): how
/// S3's EncodingType "url" writes keys.
std::string url_decode(const std::string& text);

}  // namespace gpurun::s3xml

// Where an S3 checkpoint lives (`--ckpt s3://BUCKET/PREFIX`) and how to reach it: the endpoint,
// region and credentials, read the way the AWS SDKs and CLI read them, so that a machine already
// set up for `aws s3` needs nothing more.
//
// Only static keys are read (environment or profile files). Instance roles (IMDS), SSO,
// credential_process and web identity tokens are not: the SDKs fetch those over the network,
// and a run that needs them can export the keys they produce (`aws configure
// export-credentials --format env`) before starting gpurun.
#pragma once

#include <optional>
#include <string>

namespace gpurun {

/// "s3://BUCKET/PREFIX" split into its bucket and key prefix.
struct S3Url {
  std::string bucket;
  std::string prefix;  ///< without leading or trailing '/'; "" for the bucket's root

  /// "s3://BUCKET/PREFIX" -> {BUCKET, PREFIX}; nullopt when `text` does not start with "s3://"
  /// (a local path). Throws ConfigError for an s3:// URL without a bucket or whose bucket name
  /// has characters S3 refuses (anything but letters, digits, '.', '-', '_'), naming the text.
  static std::optional<S3Url> parse(const std::string& text);
  /// "s3://BUCKET/PREFIX", or "s3://BUCKET" for an empty prefix.
  std::string str() const;
  /// The key of `name` under the prefix: "PREFIX/name", or "name" for an empty prefix.
  std::string key(const std::string& name) const;
};

/// Whether `text` names S3 storage ("s3://..."), rather than a local or mounted path.
bool is_s3_url(const std::string& text);

/// The endpoint, region and credentials of S3 requests, resolved once at start-up.
struct S3Settings {
  std::string endpoint;  ///< "https://s3.us-east-1.amazonaws.com" or a custom one, no trailing '/'
  std::string region;    ///< signing region, e.g. "us-east-1"
  std::string access_key_id;
  std::string secret_access_key;  ///< secret: never logged, printed or put in a message
  std::string session_token;      ///< secret too; "" for long-term keys
  /// Path-style URLs (ENDPOINT/BUCKET/KEY) rather than virtual-host ones
  /// (BUCKET.HOST/KEY): what MinIO, Ceph radosgw and most custom endpoints need.
  bool path_style = false;
  /// Where the credentials came from, for messages: "environment", or
  /// "profile NAME (/home/u/.aws/credentials)".
  std::string credentials_source;

  /// Reads the AWS SDKs' standard configuration:
  ///  - credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and optional AWS_SESSION_TOKEN;
  ///    else those of the profile AWS_PROFILE (default "default"): its "[NAME]" section in
  ///    AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/credentials), else its "[profile NAME]"
  ///    ("[default]") section of AWS_CONFIG_FILE (default ~/.aws/config);
  ///  - endpoint: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's nested `s3 =` block's
  ///    endpoint_url, then the profile's endpoint_url; none: https://s3.REGION.amazonaws.com;
  ///  - region: AWS_REGION, AWS_DEFAULT_REGION, the profile's region, then "us-east-1";
  ///  - addressing: AWS_S3_ADDRESSING_STYLE, then the profile's nested
  ///    `s3 =` / `  addressing_style = path|virtual|auto`; "auto" (the default) means
  ///    virtual-host for AWS's own endpoint and path-style for a custom one, since
  ///    virtual-host names need wildcard DNS that self-hosted servers rarely have.
  /// Empty variables count as unset. Throws ConfigError naming what is missing or wrong (a
  /// half-set key pair, an AWS_PROFILE found in neither file, an unreadable file, an endpoint
  /// without http:// or https://, an unknown addressing style), never a secret's value.
  static S3Settings from_environment();

  /// "endpoint http://127.0.0.1:7480 (path-style), region us-east-1, credentials from
  /// environment (key ...WXYZ)" for the start-up summary: no secret, and only the access key
  /// id's last 4 characters, as `aws configure list` shows it.
  std::string describe() const;
};

}  // namespace gpurun

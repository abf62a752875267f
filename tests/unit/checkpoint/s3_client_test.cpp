// S3Client (s3/s3_client.h) and S3Settings (s3_settings.h).
//
// Settings, URLs and XML need no server. The rest runs against a real S3 server: the one
// scripts/s3-gateway.sh started (GPURUN_S3_GATEWAY_DIR=DIR: DIR/env is read), else the one the
// AWS_* variables name (AWS_ENDPOINT_URL and keys); without either, those tests are skipped
// with the reason. Each test makes a bucket of its own and deletes it after. The fault tests
// put tests/tools/s3/fault_proxy.py between client and server (skipped without python3 or the
// proxy; GPURUN_SOURCE_DIR names the checkout when the tests run outside it).
#include "s3/s3_client.h"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <curl/curl.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include "common/log_capture.h"
#include "common/temp_dir.h"
#include "gpurun/errors.h"
#include "s3/s3_settings.h"
#include "s3/s3_xml.h"

extern char** environ;

namespace gpurun {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Sets and unsets variables for its lifetime, then puts back what was there.
class ScopedEnv {
 public:
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }
  void set(const std::string& name, const std::string& value) {
    save(name);
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  void unset(const std::string& name) {
    save(name);
    ::unsetenv(name.c_str());
  }
  // Every AWS_* variable unset, HOME set to `home`: settings come only from what a test sets.
  void isolate(const std::string& home) {
    std::vector<std::string> names;
    for (char** e = environ; *e; ++e) {
      std::string entry = *e;
      if (entry.rfind("AWS_", 0) == 0) names.push_back(entry.substr(0, entry.find('=')));
    }
    for (const std::string& name : names) unset(name);
    set("HOME", home);
  }

 private:
  void save(const std::string& name) {
    if (saved_.count(name)) return;
    const char* value = std::getenv(name.c_str());
    saved_[name] = value ? std::optional<std::string>(value) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// ---------------------------------------------------------------------------------------------
// URLs and settings: no server.

TEST(S3Url, SplitsBucketAndPrefixWithoutOuterSlashes) {
  auto url = S3Url::parse("s3://my-bucket/runs/exp1/");
  ASSERT_TRUE(url);
  EXPECT_EQ(url->bucket, "my-bucket");
  EXPECT_EQ(url->prefix, "runs/exp1");
  EXPECT_EQ(url->str(), "s3://my-bucket/runs/exp1");
  EXPECT_EQ(url->key("LATEST"), "runs/exp1/LATEST");

  url = S3Url::parse("s3://b");
  ASSERT_TRUE(url);
  EXPECT_EQ(url->bucket, "b");
  EXPECT_EQ(url->prefix, "");
  EXPECT_EQ(url->str(), "s3://b");
  EXPECT_EQ(url->key("LATEST"), "LATEST");
  EXPECT_EQ(S3Url::parse("s3://b///x//y//")->prefix, "x//y");

  EXPECT_FALSE(S3Url::parse("/data/ckpt"));
  EXPECT_FALSE(S3Url::parse("ckpt"));
  EXPECT_FALSE(S3Url::parse("gs://b/x"));
  EXPECT_TRUE(is_s3_url("s3://b/x"));
  EXPECT_FALSE(is_s3_url("./s3://b"));
  EXPECT_THROW(S3Url::parse("s3://"), ConfigError);
  EXPECT_THROW(S3Url::parse("s3:///prefix"), ConfigError);
  EXPECT_THROW(S3Url::parse("s3://bad bucket/x"), ConfigError);
}

class S3SettingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_.isolate(home_.path());
    std::filesystem::create_directories(home_ / ".aws");
  }
  test::TempDir home_{"s3-settings"};
  ScopedEnv env_;
};

TEST_F(S3SettingsTest, EnvironmentKeysWithAwsEndpointAndVirtualHosts) {
  env_.set("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE1234");
  env_.set("AWS_SECRET_ACCESS_KEY", "very-secret-value");
  env_.set("AWS_SESSION_TOKEN", "session-token-value");
  S3Settings s = S3Settings::from_environment();
  EXPECT_EQ(s.access_key_id, "AKIAEXAMPLE1234");
  EXPECT_EQ(s.secret_access_key, "very-secret-value");
  EXPECT_EQ(s.session_token, "session-token-value");
  EXPECT_EQ(s.credentials_source, "environment");
  EXPECT_EQ(s.region, "us-east-1");
  EXPECT_EQ(s.endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_FALSE(s.path_style);
  std::string shown = s.describe();
  EXPECT_EQ(shown.find("very-secret-value"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("session-token-value"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("AKIAEXAMPLE1234"), std::string::npos) << shown;
  EXPECT_NE(shown.find("...1234"), std::string::npos) << shown;

  env_.set("AWS_DEFAULT_REGION", "eu-west-1");
  EXPECT_EQ(S3Settings::from_environment().region, "eu-west-1");
  EXPECT_EQ(S3Settings::from_environment().endpoint, "https://s3.eu-west-1.amazonaws.com");
  env_.set("AWS_REGION", "eu-central-1");  // AWS_REGION wins
  EXPECT_EQ(S3Settings::from_environment().region, "eu-central-1");
  env_.set("AWS_REGION", "cn-north-1");
  EXPECT_EQ(S3Settings::from_environment().endpoint, "https://s3.cn-north-1.amazonaws.com.cn");
}

TEST_F(S3SettingsTest, CustomEndpointMeansPathStyleUnlessOverridden) {
  env_.set("AWS_ACCESS_KEY_ID", "K");
  env_.set("AWS_SECRET_ACCESS_KEY", "S");
  env_.set("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/");
  S3Settings s = S3Settings::from_environment();
  EXPECT_EQ(s.endpoint, "http://127.0.0.1:9000");
  EXPECT_TRUE(s.path_style);
  env_.set("AWS_ENDPOINT_URL_S3", "https://minio.example:9443");  // the S3-specific one wins
  EXPECT_EQ(S3Settings::from_environment().endpoint, "https://minio.example:9443");
  env_.set("AWS_S3_ADDRESSING_STYLE", "virtual");
  EXPECT_FALSE(S3Settings::from_environment().path_style);
  env_.set("AWS_S3_ADDRESSING_STYLE", "sideways");
  EXPECT_THROW(S3Settings::from_environment(), ConfigError);
  env_.unset("AWS_S3_ADDRESSING_STYLE");
  env_.set("AWS_ENDPOINT_URL_S3", "minio.example:9000");
  try {
    S3Settings::from_environment();
    FAIL() << "an endpoint without a scheme was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("AWS_ENDPOINT_URL_S3"), std::string::npos) << e.what();
  }
}

TEST_F(S3SettingsTest, HalfSetKeysAreRefusedWithoutShowingTheSecret) {
  env_.set("AWS_SECRET_ACCESS_KEY", "half-set-secret");
  try {
    S3Settings::from_environment();
    FAIL() << "a secret without a key id was accepted";
  } catch (const ConfigError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("AWS_ACCESS_KEY_ID"), std::string::npos) << message;
    EXPECT_EQ(message.find("half-set-secret"), std::string::npos) << message;
  }
}

TEST_F(S3SettingsTest, ProfileFilesGiveKeysRegionEndpointAndAddressing) {
  write_text(home_ / ".aws/credentials",
             "[default]\naws_access_key_id = DEFAULTKEY\naws_secret_access_key = default-secret\n"
             "\n# a comment\n[work]\nAWS_ACCESS_KEY_ID=WORKKEY0001\n"
             "aws_secret_access_key=work-secret\naws_session_token = work-token\n");
  write_text(home_ / ".aws/config",
             "[default]\nregion = us-west-2\n\n"
             "[profile work]\nregion = ap-south-1\nendpoint_url = http://10.0.0.5:7480\n"
             "s3 =\n  addressing_style = virtual\n  signature_version = s3v4\n"
             "output = json\n");

  S3Settings s = S3Settings::from_environment();
  EXPECT_EQ(s.access_key_id, "DEFAULTKEY");
  EXPECT_EQ(s.secret_access_key, "default-secret");
  EXPECT_EQ(s.region, "us-west-2");
  EXPECT_EQ(s.endpoint, "https://s3.us-west-2.amazonaws.com");
  EXPECT_EQ(s.credentials_source, "profile default (" + home_.path() + "/.aws/credentials)");

  env_.set("AWS_PROFILE", "work");
  s = S3Settings::from_environment();
  EXPECT_EQ(s.access_key_id, "WORKKEY0001");
  EXPECT_EQ(s.secret_access_key, "work-secret");
  EXPECT_EQ(s.session_token, "work-token");
  EXPECT_EQ(s.region, "ap-south-1");
  EXPECT_EQ(s.endpoint, "http://10.0.0.5:7480");
  EXPECT_FALSE(s.path_style) << "the profile's s3 block asks for virtual-host addressing";

  // The environment comes first, for each setting on its own.
  env_.set("AWS_REGION", "eu-north-1");
  env_.set("AWS_ENDPOINT_URL", "http://127.0.0.1:1234");
  s = S3Settings::from_environment();
  EXPECT_EQ(s.region, "eu-north-1");
  EXPECT_EQ(s.endpoint, "http://127.0.0.1:1234");
  EXPECT_EQ(s.access_key_id, "WORKKEY0001");

  // Files named by the variables, "~" expanded; keys only in the config file are read too.
  std::filesystem::create_directories(home_ / "elsewhere");
  write_text(home_ / "elsewhere/config",
             "[profile lab]\naws_access_key_id = LABKEY\naws_secret_access_key = lab-secret\n"
             "s3 =\n  addressing_style = path\n");
  env_.set("AWS_CONFIG_FILE", "~/elsewhere/config");
  env_.set("AWS_SHARED_CREDENTIALS_FILE", home_ / "elsewhere/none");
  env_.set("AWS_PROFILE", "lab");
  env_.unset("AWS_ENDPOINT_URL");
  s = S3Settings::from_environment();
  EXPECT_EQ(s.access_key_id, "LABKEY");
  EXPECT_TRUE(s.path_style);
  EXPECT_EQ(s.credentials_source, "profile lab (" + home_.path() + "/elsewhere/config)");
}

TEST_F(S3SettingsTest, MissingProfileOrKeysAreConfigErrorsNamingWhatIsMissing) {
  try {
    S3Settings::from_environment();
    FAIL() << "no credentials at all was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("AWS_ACCESS_KEY_ID"), std::string::npos) << e.what();
  }
  env_.set("AWS_PROFILE", "nosuch");
  try {
    S3Settings::from_environment();
    FAIL() << "a missing profile was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nosuch"), std::string::npos) << e.what();
  }
  write_text(home_ / ".aws/credentials", "[nosuch]\naws_secret_access_key = lonely-secret\n");
  try {
    S3Settings::from_environment();
    FAIL() << "a secret without its key id was accepted";
  } catch (const ConfigError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("aws_access_key_id"), std::string::npos) << message;
    EXPECT_EQ(message.find("lonely-secret"), std::string::npos) << message;
  }
}

TEST(S3Xml, ReadsListingsErrorsAndEncodedKeys) {
  EXPECT_EQ(s3xml::url_decode("a%2Fb+c%2Bd%20e%zz%"), "a/b c+d e%zz%");
  auto error = s3xml::parse_error(
      "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>gone</Message>"
      "<StringToSign>x-amz-security-token:SECRET</StringToSign></Error>");
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code, "NoSuchKey");
  EXPECT_EQ(error->message, "gone");
  EXPECT_FALSE(s3xml::parse_error("not xml"));
  EXPECT_FALSE(s3xml::parse_error(""));

  s3xml::ListPage page = s3xml::parse_list_objects(
      "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
      "<EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
      "<NextContinuationToken>tok+en/=</NextContinuationToken>"
      "<Contents><Key>a%20b%2Bc</Key><Size>12</Size><ETag>&quot;abc&quot;</ETag></Contents>"
      "<CommonPrefixes><Prefix>dir%2F</Prefix></CommonPrefixes></ListBucketResult>");
  ASSERT_EQ(page.objects.size(), 1u);
  EXPECT_EQ(page.objects[0].key, "a b+c");
  EXPECT_EQ(page.objects[0].size, 12);
  EXPECT_EQ(page.objects[0].etag, "abc");
  ASSERT_EQ(page.prefixes.size(), 1u);
  EXPECT_EQ(page.prefixes[0], "dir/");
  EXPECT_TRUE(page.truncated);
  EXPECT_EQ(page.next_token, "tok+en/=") << "the token is never decoded";
  EXPECT_THROW(s3xml::parse_list_objects("<Error/>"), std::runtime_error);

  EXPECT_EQ(s3xml::delete_body({"a&b", "<c>"}),
            "<Delete><Quiet>true</Quiet><Object><Key>a&amp;b</Key></Object>"
            "<Object><Key>&lt;c&gt;</Key></Object></Delete>");
  EXPECT_FALSE(s3xml::xml_safe(std::string("a\x01", 2)));
  EXPECT_TRUE(s3xml::xml_safe("a\tb"));
}

TEST(S3ClientOptions, OutOfRangeOptionsAreConfigErrors) {
  S3Settings s;
  s.endpoint = "http://127.0.0.1:1";
  s.region = "us-east-1";
  S3Client::Options small;
  small.part_bytes = 1 << 20;
  EXPECT_THROW(S3Client(s, "b", small), ConfigError);
  S3Client::Options none;
  none.parts_in_flight = 0;
  EXPECT_THROW(S3Client(s, "b", none), ConfigError);
  S3Client::Options pages;
  pages.list_page_keys = 1001;
  EXPECT_THROW(S3Client(s, "b", pages), ConfigError);
}

// ---------------------------------------------------------------------------------------------
// Against a server.

// The server's settings, read once: nullopt (and why) when none is configured.
struct Server {
  std::optional<S3Settings> settings;
  std::string why_not;
};

const Server& server() {
  static const Server found = [] {
    Server s;
    ScopedEnv env;
    // The environment's gateway, else the one ctest's fixture starts for this build.
    const char* dir = std::getenv("GPURUN_S3_GATEWAY_DIR");
#ifdef GPURUN_S3_GATEWAY_DIR
    if (!dir && std::filesystem::exists(std::string(GPURUN_S3_GATEWAY_DIR) + "/env"))
      dir = GPURUN_S3_GATEWAY_DIR;
#endif
    if (dir) {
      std::ifstream in(std::string(dir) + "/env");
      if (!in) {
        s.why_not = std::string("GPURUN_S3_GATEWAY_DIR=") + dir + " has no env file";
        return s;
      }
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind("export ", 0) == 0) line = line.substr(7);
        size_t eq = line.find('=');
        if (eq != std::string::npos) env.set(line.substr(0, eq), line.substr(eq + 1));
      }
    } else if (!std::getenv("AWS_ENDPOINT_URL") && !std::getenv("AWS_ENDPOINT_URL_S3")) {
      s.why_not =
          "no S3 server: run scripts/s3-gateway.sh start DIR and set GPURUN_S3_GATEWAY_DIR=DIR "
          "(or AWS_ENDPOINT_URL and keys)";
      return s;
    }
    try {
      s.settings = S3Settings::from_environment();
    } catch (const std::exception& e) {
      s.why_not = std::string("S3 settings: ") + e.what();
    }
    return s;
  }();
  return found;
}

// One signed request outside S3Client, for what it does not do (buckets, a bare multipart
// start). Returns the HTTP status; the body in `body`.
long raw_request(const S3Settings& s, const std::string& method, const std::string& path,
                 std::string* body = nullptr) {
  CURL* curl = curl_easy_init();
  std::string url = s.endpoint + path;
  std::string sigv4 = "aws:amz:" + s.region + ":s3";
  std::string answer;
  curl_slist* headers = curl_slist_append(
      nullptr,
      "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(curl, CURLOPT_USERNAME, s.access_key_id.c_str());
  curl_easy_setopt(curl, CURLOPT_PASSWORD, s.secret_access_key.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 30L);
  if (method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, 0L);
  } else {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t n, void* user) {
        static_cast<std::string*>(user)->append(data, size * n);
        return size * n;
      });
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
  long status = 0;
  if (curl_easy_perform(curl) == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  if (body) *body = answer;
  return status;
}

// Bytes that depend on their position only, so that any piece can be made and checked alone.
void fill(char* out, size_t bytes, uint64_t offset, uint64_t seed) {
  for (size_t i = 0; i < bytes; ++i) {
    uint64_t x = (offset + i) / 8 + seed * 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    out[i] = static_cast<char>(x >> (8 * ((offset + i) % 8)));
  }
}

std::string pattern(size_t bytes, uint64_t seed, uint64_t offset = 0) {
  std::string out(bytes, '\0');
  fill(out.data(), bytes, offset, seed);
  return out;
}

// A source of `total` pattern bytes, handed over in pieces of `piece` bytes.
ByteSource pattern_source(int64_t total, uint64_t seed, size_t piece = (1 << 20) + 7) {
  return [=](const ByteSink& sink) {
    std::string buffer(piece, '\0');
    for (int64_t at = 0; at < total;) {
      size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(piece), total - at));
      fill(buffer.data(), n, static_cast<uint64_t>(at), seed);
      sink(buffer.data(), n);
      at += static_cast<int64_t>(n);
    }
  };
}

// A sink that checks what it receives against the pattern, in order.
struct PatternCheck {
  uint64_t seed;
  int64_t offset = 0;
  int64_t mismatches = 0;
  ByteSink sink() {
    return [this](const char* data, size_t bytes) {
      std::string expected = pattern(bytes, seed, static_cast<uint64_t>(offset));
      if (expected.compare(0, bytes, data, bytes) != 0) ++mismatches;
      offset += static_cast<int64_t>(bytes);
    };
  }
};

std::string md5_hex(const std::string& bytes) {
  unsigned char hash[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), hash, &length, EVP_md5(), nullptr);
  char text[3];
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    std::snprintf(text, sizeof text, "%02x", hash[i]);
    out += text;
  }
  return out;
}

bool ends_with(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() &&
         text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

// A test's own bucket: made at the start, emptied and deleted at the end.
class S3ServerClient : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!server().settings) GTEST_SKIP() << server().why_not;
    settings_ = *server().settings;
    static std::atomic<int> counter{0};
    bucket_ = "gpurun-t" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
              std::to_string(std::chrono::system_clock::now().time_since_epoch().count() % 100000);
    long status = raw_request(settings_, "PUT", "/" + bucket_);
    ASSERT_EQ(status, 200) << "creating bucket " << bucket_ << " at " << settings_.endpoint;
  }

  void TearDown() override {
    if (bucket_.empty()) return;
    try {
      S3Client client(settings_, bucket_);
      for (const S3Upload& u : client.list_multipart_uploads("")) client.abort_multipart_upload(u);
      std::vector<std::string> keys;
      for (const S3Object& o : client.list("").objects) keys.push_back(o.key);
      client.remove(keys);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "emptying " << bucket_ << ": " << e.what();
    }
    raw_request(settings_, "DELETE", "/" + bucket_);
  }

  // Options with retries recorded (and checked for secrets) instead of logged.
  S3Client::Options options() {
    S3Client::Options o;
    o.on_retry = [this](const std::string& message) {
      std::lock_guard<std::mutex> lock(retries_mutex_);
      retries_.push_back(message);
    };
    return o;
  }
  std::vector<std::string> retries() {
    std::lock_guard<std::mutex> lock(retries_mutex_);
    return retries_;
  }
  void expect_no_secret(const std::string& text) {
    EXPECT_EQ(text.find(settings_.secret_access_key), std::string::npos) << text;
    if (!settings_.session_token.empty()) {
      EXPECT_EQ(text.find(settings_.session_token), std::string::npos) << text;
    }
  }

  S3Settings settings_;
  std::string bucket_;
  std::mutex retries_mutex_;
  std::vector<std::string> retries_;
};

TEST_F(S3ServerClient, PutGetHeadRemove) {
  S3Client client(settings_, bucket_, options());
  client.check_bucket();
  std::string bytes = pattern(100000, 1);
  std::optional<std::string> etag = client.put("dir/object.bin", bytes);
  ASSERT_TRUE(etag);
  EXPECT_EQ(*etag, md5_hex(bytes));

  EXPECT_EQ(client.get("dir/object.bin"), bytes);
  std::optional<S3Object> head = client.head("dir/object.bin");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->key, "dir/object.bin");
  EXPECT_EQ(head->size, 100000);
  EXPECT_EQ(head->etag, *etag);

  client.put("empty", "");
  EXPECT_EQ(client.get("empty"), "");
  EXPECT_EQ(client.head("empty")->size, 0);

  client.remove("dir/object.bin");
  client.remove("dir/object.bin");  // absent is fine
  EXPECT_FALSE(client.head("dir/object.bin"));
  try {
    client.get("dir/object.bin");
    FAIL() << "a missing object was read";
  } catch (const S3Error& e) {
    EXPECT_EQ(e.http_status(), 404);
    EXPECT_EQ(e.code(), "NoSuchKey");
    EXPECT_EQ(e.error_number(), EIO);
    EXPECT_EQ(e.path(), "s3://" + bucket_ + "/dir/object.bin");
    EXPECT_NE(std::string(e.what()).find("NoSuchKey"), std::string::npos) << e.what();
    expect_no_secret(e.what());
  }
  EXPECT_TRUE(retries().empty());
}

TEST_F(S3ServerClient, KeysWithCharactersThatNeedEncoding) {
  S3Client client(settings_, bucket_, options());
  const std::vector<std::string> keys = {
      "space and plus+equals=amp&pct%tilde~(x)!*'$@,;:.bin",
      "unicode-\xc3\xbc\xe2\x82\xac/file",
      "dots/./and/../segments",
      "double//slash",
      "query?hash#bracket[1]{2}",
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(client.put(keys[i], "value " + std::to_string(i))) << keys[i];
    EXPECT_EQ(client.get(keys[i]), "value " + std::to_string(i)) << keys[i];
    ASSERT_TRUE(client.head(keys[i])) << keys[i];
  }
  S3Listing listing = client.list("");
  std::vector<std::string> listed;
  for (const S3Object& o : listing.objects) listed.push_back(o.key);
  std::vector<std::string> expected = keys;
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(listed, expected);
  EXPECT_EQ(client.list("space and plus+").objects.size(), 1u);
  client.remove(keys);
  EXPECT_TRUE(client.list("").objects.empty());
}

TEST_F(S3ServerClient, ListPagesAndCommonPrefixes) {
  S3Client::Options o = options();
  o.list_page_keys = 2;  // 7 keys: 4 pages
  S3Client client(settings_, bucket_, o);
  for (const char* key : {"run/a/1", "run/a/2", "run/b/1", "run/c", "run/d", "run/e", "other"})
    client.put(key, key);
  S3Listing all = client.list("run/");
  ASSERT_EQ(all.objects.size(), 6u);
  EXPECT_EQ(all.objects.front().key, "run/a/1");
  EXPECT_EQ(all.objects.back().key, "run/e");
  EXPECT_EQ(all.objects.front().size, 7);
  EXPECT_EQ(all.objects.front().etag, md5_hex("run/a/1"));
  EXPECT_TRUE(all.prefixes.empty());
  EXPECT_EQ(client.list("").objects.size(), 7u);

  S3Listing dirs = client.list("run/", "/");
  EXPECT_EQ(dirs.prefixes, (std::vector<std::string>{"run/a/", "run/b/"}));
  ASSERT_EQ(dirs.objects.size(), 3u);
  EXPECT_EQ(dirs.objects[0].key, "run/c");
  EXPECT_TRUE(client.list("nothing/").objects.empty());
}

TEST_F(S3ServerClient, RangedGets) {
  S3Client client(settings_, bucket_, options());
  std::string bytes = pattern(1 << 20, 2);
  client.put("obj", bytes);
  std::string got;
  ByteSink append = [&got](const char* data, size_t n) { got.append(data, n); };
  client.get("obj", 1000, 5000, append);
  EXPECT_EQ(got, bytes.substr(1000, 5000));
  got.clear();
  client.get("obj", 1000000, -1, append);
  EXPECT_EQ(got, bytes.substr(1000000));
  got.clear();
  client.get("obj", 0, 0, append);
  EXPECT_EQ(got, "");
  client.get("obj", bytes.size(), -1, append);  // from the end to the end: nothing
  EXPECT_EQ(got, "");
  try {
    client.get("obj", bytes.size() - 10, 20, append);
    FAIL() << "a range past the end was read";
  } catch (const S3Error& e) {
    EXPECT_EQ(e.http_status(), 416) << e.what();
  }
  try {
    client.get("obj", bytes.size() + 10, -1, append);
    FAIL() << "an offset past the end was read";
  } catch (const S3Error& e) {
    EXPECT_EQ(e.http_status(), 416) << e.what();
  }
  // A whole object through download(), in one part and in several.
  PatternCheck check{2};
  client.download("obj", bytes.size(), check.sink());
  EXPECT_EQ(check.offset, static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(check.mismatches, 0);
  EXPECT_THROW(client.download("obj", bytes.size() + 1, check.sink()), S3Error);
}

TEST_F(S3ServerClient, UploadOf40MiBIn8MiBPartsReadsBack) {
  S3Client::Options o = options();
  o.part_bytes = 8 << 20;
  o.parts_in_flight = 4;
  S3Client client(settings_, bucket_, o);
  const int64_t size = 40 << 20;
  auto start = Clock::now();
  S3Object object = client.upload("big/model.pt", pattern_source(size, 3));
  double up = seconds_since(start);
  EXPECT_EQ(object.key, "big/model.pt");
  EXPECT_EQ(object.size, size);
  EXPECT_TRUE(ends_with(object.etag, "-5")) << object.etag;
  std::optional<S3Object> head = client.head("big/model.pt");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->size, size);
  EXPECT_EQ(head->etag, object.etag);

  start = Clock::now();
  PatternCheck check{3};
  client.download("big/model.pt", size, check.sink());
  double down = seconds_since(start);
  EXPECT_EQ(check.offset, size);
  EXPECT_EQ(check.mismatches, 0);
  PatternCheck whole{3};
  client.get("big/model.pt", 0, -1, whole.sink());
  EXPECT_EQ(whole.offset, size);
  EXPECT_EQ(whole.mismatches, 0);
  std::printf("[          ] 40 MiB: upload %.2f s, parallel download %.2f s\n", up, down);
  EXPECT_TRUE(client.list_multipart_uploads("").empty());
  EXPECT_TRUE(retries().empty());
}

TEST_F(S3ServerClient, SmallUploadsAreOnePut) {
  S3Client client(settings_, bucket_, options());
  S3Object small = client.upload("small", pattern_source(1000, 4, 77));
  EXPECT_EQ(small.size, 1000);
  EXPECT_EQ(small.etag, md5_hex(pattern(1000, 4)));
  S3Object exact = client.upload("exact", pattern_source(8 << 20, 5));
  EXPECT_EQ(exact.size, 8 << 20);
  EXPECT_EQ(exact.etag.find('-'), std::string::npos) << "one part's worth is one PUT";
  S3Object empty = client.upload("empty", [](const ByteSink&) {});
  EXPECT_EQ(empty.size, 0);
  EXPECT_EQ(client.get("empty"), "");
  S3Object just_over = client.upload("over", pattern_source((8 << 20) + 1, 6));
  EXPECT_TRUE(ends_with(just_over.etag, "-2")) << just_over.etag;
  PatternCheck check{6};
  client.download("over", (8 << 20) + 1, check.sink());
  EXPECT_EQ(check.mismatches, 0);
  EXPECT_EQ(check.offset, (8 << 20) + 1);
}

TEST_F(S3ServerClient, ConditionalPuts) {
  S3Client client(settings_, bucket_, options());
  std::optional<std::string> first = client.put("LATEST", "one", S3Client::Condition::kIfAbsent);
  ASSERT_TRUE(first);
  EXPECT_FALSE(client.put("LATEST", "two", S3Client::Condition::kIfAbsent))
      << "If-None-Match: * wrote over an existing object";
  EXPECT_EQ(client.get("LATEST"), "one");
  EXPECT_FALSE(client.put("LATEST", "two", S3Client::Condition::kIfMatch, md5_hex("other")));
  EXPECT_EQ(client.get("LATEST"), "one");
  std::optional<std::string> second =
      client.put("LATEST", "two", S3Client::Condition::kIfMatch, *first);
  ASSERT_TRUE(second);
  EXPECT_EQ(*second, md5_hex("two"));
  EXPECT_EQ(client.get("LATEST"), "two");
  EXPECT_FALSE(client.put("LATEST", "three", S3Client::Condition::kIfMatch, *first))
      << "an old ETag matched";
}

TEST_F(S3ServerClient, MultipartUploadsAreListedAndAborted) {
  S3Client::Options o = options();
  o.list_page_keys = 1;
  S3Client client(settings_, bucket_, o);
  std::string answer;
  ASSERT_EQ(raw_request(settings_, "POST", "/" + bucket_ + "/ckpt/a.bin?uploads=", &answer), 200)
      << answer;
  ASSERT_EQ(raw_request(settings_, "POST", "/" + bucket_ + "/ckpt/b.bin?uploads=", &answer), 200)
      << answer;
  std::string id_b = s3xml::parse_upload_id(answer);
  ASSERT_EQ(raw_request(settings_, "POST", "/" + bucket_ + "/other/c.bin?uploads=", &answer), 200);
  std::vector<S3Upload> uploads = client.list_multipart_uploads("ckpt/");
  ASSERT_EQ(uploads.size(), 2u);
  EXPECT_EQ(uploads[0].key, "ckpt/a.bin");
  EXPECT_EQ(uploads[1].key, "ckpt/b.bin");
  EXPECT_EQ(uploads[1].upload_id, id_b);
  for (const S3Upload& u : uploads) client.abort_multipart_upload(u);
  client.abort_multipart_upload(uploads[0]);  // already gone is fine
  EXPECT_TRUE(client.list_multipart_uploads("ckpt/").empty());
  EXPECT_EQ(client.list_multipart_uploads("").size(), 1u);

  // A source that fails halfway: the upload is aborted and the error is the source's.
  auto failing = [](const ByteSink& sink) {
    pattern_source(20 << 20, 7)(sink);
    throw std::runtime_error("source failed");
  };
  EXPECT_THROW(client.upload("ckpt/failed.bin", failing), std::runtime_error);
  EXPECT_TRUE(client.list_multipart_uploads("ckpt/").empty());
  EXPECT_FALSE(client.head("ckpt/failed.bin"));
}

TEST_F(S3ServerClient, RemoveInBatchesOf1000) {
  S3Client client(settings_, bucket_, options());
  const int count = 1003;
  std::vector<std::string> keys;
  for (int i = 0; i < count; ++i) keys.push_back("many/" + std::to_string(i));
  std::vector<std::thread> threads;
  std::atomic<int> next{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < count; i = next++) client.put(keys[static_cast<size_t>(i)], "x");
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(client.list("many/").objects.size(), static_cast<size_t>(count));
  keys.push_back("many/absent");
  client.remove(keys);
  EXPECT_TRUE(client.list("many/").objects.empty());
  client.remove(std::vector<std::string>{});
}

TEST_F(S3ServerClient, CheckBucketNamesEachFailureQuicklyWithoutTheSecret) {
  S3Client(settings_, bucket_).check_bucket();

  auto expect_config_error = [&](S3Client& client, const std::string& expected) {
    auto start = Clock::now();
    try {
      client.check_bucket();
      ADD_FAILURE() << "check_bucket passed; expected " << expected;
    } catch (const ConfigError& e) {
      std::string message = e.what();
      EXPECT_NE(message.find(expected), std::string::npos) << message;
      expect_no_secret(message);
      EXPECT_EQ(message.find(client.settings().secret_access_key), std::string::npos) << message;
      std::printf("[          ] %s\n", message.c_str());
    }
    EXPECT_LT(seconds_since(start), 10);
  };

  S3Settings wrong = settings_;
  wrong.secret_access_key = "wrong-secret-" + settings_.secret_access_key.substr(0, 8);
  S3Client wrong_secret(wrong, bucket_);
  expect_config_error(wrong_secret, "rejected by " + settings_.endpoint);

  S3Settings unknown = settings_;
  unknown.access_key_id = "NOSUCHKEY0000000";
  S3Client unknown_key(unknown, bucket_);
  expect_config_error(unknown_key, "rejected by");

  S3Client missing(settings_, bucket_ + "-missing");
  expect_config_error(missing, "does not exist at " + settings_.endpoint);

  // A port nobody listens on: bound, then closed.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  S3Settings dead = settings_;
  dead.endpoint = "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  S3Client dead_port(dead, bucket_);
  expect_config_error(dead_port, "does not answer");

  // A server that takes the connection and never answers: listening, never accepting (the
  // kernel completes the handshake into the backlog).
  int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in silent_address{};
  silent_address.sin_family = AF_INET;
  silent_address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  length = sizeof silent_address;
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&silent_address), sizeof silent_address), 0);
  ASSERT_EQ(::listen(silent, 8), 0);
  ::getsockname(silent, reinterpret_cast<sockaddr*>(&silent_address), &length);
  S3Settings hanging = settings_;
  hanging.endpoint = "http://127.0.0.1:" + std::to_string(ntohs(silent_address.sin_port));
  S3Client hanging_server(hanging, bucket_);
  expect_config_error(hanging_server, "does not answer");
  ::close(silent);
  // Other requests retry a refused connection until their deadline, then say so.
  S3Client::Options brief = options();
  brief.retry_seconds = 1;
  S3Client dead_retrying(dead, bucket_, brief);
  try {
    dead_retrying.head("x");
    FAIL() << "a dead endpoint answered";
  } catch (const S3Error& e) {
    EXPECT_EQ(e.http_status(), 0);
    EXPECT_EQ(e.code(), "");
    EXPECT_NE(std::string(e.what()).find("gave up after"), std::string::npos) << e.what();
    expect_no_secret(e.what());
  }
  EXPECT_FALSE(retries().empty());
  for (const std::string& message : retries()) expect_no_secret(message);
}

TEST_F(S3ServerClient, SecretsStayOutOfMessagesAndLogs) {
  // A session token the server does not know, a wrong secret: every request fails. Nothing
  // shown may carry either (spdlog, the default on_retry, takes the retries here).
  S3Settings bad = settings_;
  bad.secret_access_key = "SECRET-" + std::string(30, 'q');
  bad.session_token = "TOKEN-" + std::string(40, 'z');
  test::LogCapture log;
  S3Client::Options o;
  o.retry_seconds = 2;
  S3Client client(bad, bucket_, o);
  std::vector<std::string> messages;
  auto collect = [&](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "a request with bad credentials succeeded";
    } catch (const std::exception& e) {
      messages.push_back(e.what());
    }
  };
  collect([&] { client.check_bucket(); });
  collect([&] { client.put("k", "v"); });
  collect([&] { client.get("k"); });
  collect([&] { client.list(""); });
  collect([&] { client.upload("k", pattern_source(9 << 20, 8)); });
  S3Settings dead = bad;
  dead.endpoint = "http://127.0.0.1:1";
  S3Client dead_client(dead, bucket_, o);
  collect([&] { dead_client.head("k"); });
  messages.push_back(log.text());
  for (const std::string& m : messages) {
    EXPECT_EQ(m.find(bad.secret_access_key), std::string::npos) << m;
    EXPECT_EQ(m.find(bad.session_token), std::string::npos) << m;
    EXPECT_EQ(m.find("Signature="), std::string::npos) << m;
  }
  EXPECT_NE(log.text().find("retrying"), std::string::npos) << "the dead endpoint's retries";
}

TEST_F(S3ServerClient, HostMemoryOfA200MiBUploadStaysNearPartsInFlightPlusOne) {
  S3Client::Options o = options();
  S3Client client(settings_, bucket_, o);
  auto rss = [] {
    long pages = 0, resident = 0;
    std::ifstream("/proc/self/statm") >> pages >> resident;
    return static_cast<int64_t>(resident) * ::sysconf(_SC_PAGESIZE);
  };
  const int64_t size = 200 << 20;
  int64_t baseline = rss();
  std::atomic<int64_t> peak{baseline};
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done) {
      int64_t now = rss();
      if (now > peak) peak = now;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  auto start = Clock::now();
  S3Object object = client.upload("big/200", pattern_source(size, 9));
  double seconds = seconds_since(start);
  done = true;
  sampler.join();
  EXPECT_EQ(object.size, size);
  EXPECT_TRUE(ends_with(object.etag, "-25")) << object.etag;
  int64_t bound = (o.parts_in_flight + 1) * o.part_bytes;
  std::printf(
      "[          ] 200 MiB upload in %.1f s (%.0f MiB/s): peak RSS %.1f MiB over the %.1f MiB "
      "before; (parts_in_flight + 1) x part_bytes = %.0f MiB\n",
      seconds, 200 / seconds, (peak - baseline) / 1048576.0, baseline / 1048576.0,
      bound / 1048576.0);
}

// ---------------------------------------------------------------------------------------------
// Through tests/tools/s3/fault_proxy.py.

std::string fault_proxy_path() {
  std::vector<std::filesystem::path> roots;
  if (const char* source = std::getenv("GPURUN_SOURCE_DIR")) roots.emplace_back(source);
#ifdef GPURUN_SOURCE_DIR
  roots.emplace_back(GPURUN_SOURCE_DIR);
#endif
  for (auto dir = std::filesystem::current_path(); !dir.empty(); dir = dir.parent_path()) {
    roots.push_back(dir);
    if (dir == dir.parent_path()) break;
  }
  for (const auto& root : roots) {
    auto path = root / "tests/tools/s3/fault_proxy.py";
    if (std::filesystem::exists(path)) return path.string();
  }
  return "";
}

// The proxy, running for the object's lifetime.
class FaultProxy {
 public:
  FaultProxy(const std::string& script, const std::string& upstream,
             const std::vector<std::string>& faults)
      : dir_("s3-proxy") {
    std::vector<std::string> args = {
        "python3",     script,        "--upstream", upstream,
        "--port-file", dir_ / "port", "--log",      dir_ / "proxy.log"};
    args.insert(args.end(), faults.begin(), faults.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&pid_, "python3", nullptr, nullptr, argv.data(), environ) != 0) pid_ = 0;
    for (auto start = Clock::now(); pid_ && seconds_since(start) < 20;) {
      std::ifstream in(dir_ / "port");
      int port = 0;
      if (in >> port && port > 0) {
        endpoint_ = "http://127.0.0.1:" + std::to_string(port);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~FaultProxy() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& endpoint() const { return endpoint_; }
  std::string log() const {
    std::ifstream in(dir_ / "proxy.log");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  test::TempDir dir_;
  pid_t pid_ = 0;
  std::string endpoint_;
};

class S3ServerFaults : public S3ServerClient {
 protected:
  void SetUp() override {
    S3ServerClient::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    script_ = fault_proxy_path();
    if (script_.empty()) GTEST_SKIP() << "tests/tools/s3/fault_proxy.py not found";
  }
  // A client of this test's bucket through a proxy with `faults`.
  std::unique_ptr<FaultProxy> proxy(const std::vector<std::string>& faults) {
    auto p = std::make_unique<FaultProxy>(script_, settings_.endpoint, faults);
    if (p->endpoint().empty()) ADD_FAILURE() << "fault_proxy.py did not start";
    return p;
  }
  S3Settings through(const FaultProxy& p) {
    S3Settings s = settings_;
    s.endpoint = p.endpoint();
    s.path_style = true;
    return s;
  }
  int count_retries(const std::string& word) {
    int n = 0;
    for (const std::string& m : retries()) {
      expect_no_secret(m);
      if (m.find(word) != std::string::npos) ++n;
    }
    return n;
  }
  std::string script_;
};

TEST_F(S3ServerFaults, SlowDownOnThreePartsIsRetried) {
  auto p = proxy({"--slowdown-parts", "3"});
  ASSERT_FALSE(p->endpoint().empty());
  S3Client client(through(*p), bucket_, options());
  S3Object object = client.upload("slow.bin", pattern_source(40 << 20, 10));
  EXPECT_TRUE(ends_with(object.etag, "-5")) << object.etag;
  EXPECT_GE(count_retries("503"), 3) << p->log();
  EXPECT_GE(count_retries("SlowDown"), 3) << p->log();
  PatternCheck check{10};
  S3Client direct(settings_, bucket_);
  direct.download("slow.bin", 40 << 20, check.sink());
  EXPECT_EQ(check.mismatches, 0);
  for (const std::string& m : retries()) std::printf("[          ] retry: %s\n", m.c_str());
}

TEST_F(S3ServerFaults, ConnectionResetMidPartIsRetried) {
  auto p = proxy({"--reset-parts", "1"});
  ASSERT_FALSE(p->endpoint().empty());
  S3Client client(through(*p), bucket_, options());
  S3Object object = client.upload("reset.bin", pattern_source(24 << 20, 11));
  EXPECT_TRUE(ends_with(object.etag, "-3")) << object.etag;
  EXPECT_GE(count_retries("curl error"), 1) << p->log();
  PatternCheck check{11};
  client.download("reset.bin", 24 << 20, check.sink());
  EXPECT_EQ(check.mismatches, 0);
  for (const std::string& m : retries()) std::printf("[          ] retry: %s\n", m.c_str());
}

TEST_F(S3ServerFaults, GetCutShortResumesFromTheLastByte) {
  S3Client direct(settings_, bucket_);
  const int64_t size = 20 << 20;
  direct.upload("cut.bin", pattern_source(size, 12));
  // The first answer is cut halfway, then the resumed one (10 MiB from byte 10485760) too.
  auto p = proxy({"--cut-gets", "2"});
  ASSERT_FALSE(p->endpoint().empty());
  S3Client client(through(*p), bucket_, options());
  PatternCheck whole{12};
  client.get("cut.bin", 0, -1, whole.sink());
  EXPECT_EQ(whole.offset, size);
  EXPECT_EQ(whole.mismatches, 0);
  EXPECT_EQ(count_retries("cut short"), 2) << p->log();
  // download()'s parallel ranged GETs (8 + 8 + 4 MiB): two of them cut, each resumed alone.
  auto q = proxy({"--cut-gets", "2"});
  ASSERT_FALSE(q->endpoint().empty());
  S3Client parallel(through(*q), bucket_, options());
  PatternCheck parts{12};
  parallel.download("cut.bin", size, parts.sink());
  EXPECT_EQ(parts.offset, size);
  EXPECT_EQ(parts.mismatches, 0);
  EXPECT_EQ(count_retries("cut short"), 4) << q->log();
  for (const std::string& m : retries()) std::printf("[          ] retry: %s\n", m.c_str());
}

TEST_F(S3ServerFaults, StalledPartIsAbortedAndRetried) {
  auto p = proxy({"--stall-seconds", "30", "--stall-match", "partNumber=2", "--stall-count", "1"});
  ASSERT_FALSE(p->endpoint().empty());
  S3Client::Options o = options();
  o.stall_seconds = 5;
  S3Client client(through(*p), bucket_, o);
  auto start = Clock::now();
  S3Object object = client.upload("stall.bin", pattern_source(24 << 20, 13));
  double seconds = seconds_since(start);
  EXPECT_TRUE(ends_with(object.etag, "-3")) << object.etag;
  EXPECT_LT(seconds, 30) << "the stall was waited out, not cut";
  EXPECT_GE(count_retries("part 2"), 1) << p->log();
  std::printf("[          ] upload with a 30 s stall took %.1f s\n", seconds);
  for (const std::string& m : retries()) std::printf("[          ] retry: %s\n", m.c_str());
}

}  // namespace
}  // namespace gpurun

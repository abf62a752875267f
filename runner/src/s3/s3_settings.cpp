#include "s3/s3_settings.h"

#include <pwd.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "gpurun/errors.h"
#include "util/text.h"

namespace gpurun {
namespace {

constexpr const char* kScheme = "s3://";

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

std::string trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  size_t end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// One section of an AWS ini file. `nested` holds the indented blocks under a key whose value
// is empty ("s3 =" followed by "  addressing_style = path"), the one place the format nests.
struct IniSection {
  std::map<std::string, std::string> values;
  std::map<std::string, std::map<std::string, std::string>> nested;

  std::string get(const std::string& key) const {
    auto it = values.find(key);
    return it == values.end() ? "" : it->second;
  }
  std::string get(const std::string& block, const std::string& key) const {
    auto it = nested.find(block);
    if (it == nested.end()) return "";
    auto value = it->second.find(key);
    return value == it->second.end() ? "" : value->second;
  }
};

// A parsed ini file: section name as written between the brackets -> its keys. Keys are
// lowercased, as Python's configparser (which botocore uses) does.
using IniFile = std::map<std::string, IniSection>;

IniFile parse_ini(const std::string& text) {
  IniFile file;
  IniSection* section = nullptr;
  std::string block;  // the key with an empty value whose indented lines follow
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::string content = trim(line);
    if (content.empty() || content[0] == '#' || content[0] == ';') continue;
    if (content[0] == '[') {
      size_t close = content.find(']');
      std::string name =
          trim(content.substr(1, close == std::string::npos ? std::string::npos : close - 1));
      section = &file[name];
      block.clear();
      continue;
    }
    size_t eq = content.find('=');
    if (section == nullptr || eq == std::string::npos) continue;
    std::string key = lower(trim(content.substr(0, eq)));
    std::string value = trim(content.substr(eq + 1));
    bool indented = line[0] == ' ' || line[0] == '\t';
    if (indented && !block.empty()) {
      section->nested[block][key] = value;
    } else if (value.empty()) {
      block = key;
    } else {
      section->values[key] = value;
      block.clear();
    }
  }
  return file;
}

std::string home_dir() {
  std::string home = env("HOME");
  if (!home.empty()) return home;
  struct passwd pw;
  struct passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(getuid(), &pw, buffer, sizeof buffer, &found) == 0 && found != nullptr)
    return found->pw_dir;
  return "";
}

// "~/x" -> "$HOME/x", as the SDKs expand the file variables.
std::string expand_home(const std::string& path) {
  if (path == "~" || starts_with(path, "~/")) return home_dir() + path.substr(1);
  return path;
}

// The file at `path` parsed; an empty file when it does not exist. Throws ConfigError when it
// exists but cannot be read, since silently ignoring it would use other credentials.
IniFile read_ini(const std::string& path, const char* variable) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) return {};
    throw ConfigError("S3: cannot read " + printable(path) + " (" + variable +
                      "): " + std::strerror(err));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse_ini(text.str());
}

// A profile's settings: its section of the credentials file and of the config file.
struct Profile {
  std::string name;
  std::string credentials_path, config_path;
  const IniSection* credentials = nullptr;
  const IniSection* config = nullptr;

  std::string config_value(const std::string& key) const { return config ? config->get(key) : ""; }
  std::string config_value(const std::string& block, const std::string& key) const {
    return config ? config->get(block, key) : "";
  }
};

const IniSection* find_section(const IniFile& file, const std::string& name) {
  auto it = file.find(name);
  return it == file.end() ? nullptr : &it->second;
}

// The config file names a profile "[profile NAME]" (any spacing), except "[default]".
const IniSection* find_config_profile(const IniFile& file, const std::string& name) {
  for (const auto& [header, section] : file) {
    if (starts_with(header, "profile") && header.size() > 7 &&
        std::isspace(static_cast<unsigned char>(header[7])) && trim(header.substr(7)) == name)
      return &section;
  }
  return name == "default" ? find_section(file, "default") : nullptr;
}

void check_endpoint(const std::string& endpoint, const std::string& origin) {
  if (!starts_with(endpoint, "http://") && !starts_with(endpoint, "https://"))
    throw ConfigError("S3: endpoint " + printable(endpoint) + " (" + origin +
                      ") must start with http:// or https://");
  if (endpoint.find_first_of("?#") != std::string::npos)
    throw ConfigError("S3: endpoint " + printable(endpoint) + " (" + origin +
                      ") must not carry a query or a fragment");
}

bool valid_bucket_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
}

}  // namespace

bool is_s3_url(const std::string& text) { return starts_with(text, kScheme); }

std::optional<S3Url> S3Url::parse(const std::string& text) {
  if (!is_s3_url(text)) return std::nullopt;
  std::string rest = text.substr(std::strlen(kScheme));
  size_t slash = rest.find('/');
  S3Url url;
  url.bucket = rest.substr(0, slash);
  if (url.bucket.empty())
    throw ConfigError("S3 URL " + printable(text) + " has no bucket: write s3://BUCKET/PREFIX");
  for (char c : url.bucket) {
    if (!valid_bucket_char(c))
      throw ConfigError("S3 URL " + printable(text) + ": bucket name " + printable(url.bucket) +
                        " may hold only letters, digits, '.', '-' and '_'");
  }
  if (slash != std::string::npos) {
    std::string prefix = rest.substr(slash + 1);
    size_t begin = prefix.find_first_not_of('/');
    if (begin != std::string::npos) {
      size_t end = prefix.find_last_not_of('/');
      url.prefix = prefix.substr(begin, end - begin + 1);
    }
  }
  return url;
}

std::string S3Url::str() const {
  return prefix.empty() ? kScheme + bucket : kScheme + bucket + "/" + prefix;
}

std::string S3Url::key(const std::string& name) const {
  return prefix.empty() ? name : prefix + "/" + name;
}

S3Settings S3Settings::from_environment() {
  S3Settings s;

  std::string profile_variable = env("AWS_PROFILE");
  if (profile_variable.empty()) profile_variable = env("AWS_DEFAULT_PROFILE");
  Profile profile;
  profile.name = profile_variable.empty() ? "default" : profile_variable;
  std::string credentials_variable = env("AWS_SHARED_CREDENTIALS_FILE");
  std::string config_variable = env("AWS_CONFIG_FILE");
  profile.credentials_path = credentials_variable.empty() ? home_dir() + "/.aws/credentials"
                                                          : expand_home(credentials_variable);
  profile.config_path =
      config_variable.empty() ? home_dir() + "/.aws/config" : expand_home(config_variable);
  IniFile credentials_file = read_ini(profile.credentials_path, "AWS_SHARED_CREDENTIALS_FILE");
  IniFile config_file = read_ini(profile.config_path, "AWS_CONFIG_FILE");
  profile.credentials = find_section(credentials_file, profile.name);
  profile.config = find_config_profile(config_file, profile.name);
  if (!profile_variable.empty() && !profile.credentials && !profile.config)
    throw ConfigError("S3: AWS_PROFILE=" + printable(profile.name) + " is in neither " +
                      printable(profile.credentials_path) + " nor " +
                      printable(profile.config_path));

  // Credentials: the environment's pair, else the profile's (credentials file first).
  std::string env_key = env("AWS_ACCESS_KEY_ID");
  std::string env_secret = env("AWS_SECRET_ACCESS_KEY");
  if (!env_key.empty() || !env_secret.empty()) {
    if (env_key.empty() || env_secret.empty())
      throw ConfigError(std::string("S3: ") +
                        (env_key.empty() ? "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID "
                                         : "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY ") +
                        "is not: set both, or neither to use the profile files");
    s.access_key_id = env_key;
    s.secret_access_key = env_secret;
    s.session_token = env("AWS_SESSION_TOKEN");
    s.credentials_source = "environment";
  } else {
    for (const auto& [section, path] : {std::pair{profile.credentials, profile.credentials_path},
                                        std::pair{profile.config, profile.config_path}}) {
      if (!section) continue;
      std::string key = section->get("aws_access_key_id");
      std::string secret = section->get("aws_secret_access_key");
      if (key.empty() && secret.empty()) continue;
      if (key.empty() || secret.empty())
        throw ConfigError("S3: profile " + printable(profile.name) + " in " + printable(path) +
                          " has " + (key.empty() ? "aws_secret_access_key" : "aws_access_key_id") +
                          " but no " +
                          (key.empty() ? "aws_access_key_id" : "aws_secret_access_key"));
      s.access_key_id = key;
      s.secret_access_key = secret;
      s.session_token = section->get("aws_session_token");
      s.credentials_source = "profile " + profile.name + " (" + path + ")";
      break;
    }
    if (s.credentials_source.empty())
      throw ConfigError(
          "S3: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile " +
          printable(profile.name) + " aws_access_key_id and aws_secret_access_key in " +
          printable(profile.credentials_path) +
          " (AWS_PROFILE picks the profile; instance roles and SSO are not read: export their "
          "keys with `aws configure export-credentials --format env`)");
  }

  // Region.
  for (const std::string& candidate :
       {env("AWS_REGION"), env("AWS_DEFAULT_REGION"), profile.config_value("region")}) {
    if (!candidate.empty()) {
      s.region = candidate;
      break;
    }
  }
  if (s.region.empty()) s.region = "us-east-1";

  // Endpoint.
  std::string origin;
  for (const auto& [candidate, from] :
       {std::pair{env("AWS_ENDPOINT_URL_S3"), std::string("AWS_ENDPOINT_URL_S3")},
        std::pair{env("AWS_ENDPOINT_URL"), std::string("AWS_ENDPOINT_URL")},
        std::pair{profile.config_value("s3", "endpoint_url"),
                  "profile " + profile.name + " s3.endpoint_url"},
        std::pair{profile.config_value("endpoint_url"),
                  "profile " + profile.name + " endpoint_url"}}) {
    if (!candidate.empty()) {
      s.endpoint = candidate;
      origin = from;
      break;
    }
  }
  bool custom = !s.endpoint.empty();
  if (custom) {
    check_endpoint(s.endpoint, origin);
    while (s.endpoint.size() > 1 && s.endpoint.back() == '/') s.endpoint.pop_back();
  } else {
    // AWS's China partition has a domain of its own.
    s.endpoint =
        "https://s3." + s.region + ".amazonaws.com" + (starts_with(s.region, "cn-") ? ".cn" : "");
  }

  // Addressing style.
  std::string style = env("AWS_S3_ADDRESSING_STYLE");
  std::string style_origin = "AWS_S3_ADDRESSING_STYLE";
  if (style.empty()) {
    style = profile.config_value("s3", "addressing_style");
    style_origin = "profile " + profile.name + " s3.addressing_style";
  }
  style = lower(style);
  if (style == "path") {
    s.path_style = true;
  } else if (style == "virtual") {
    s.path_style = false;
  } else if (style.empty() || style == "auto") {
    s.path_style = custom;
  } else {
    throw ConfigError("S3: addressing style " + printable(style) + " (" + style_origin +
                      ") must be path, virtual or auto");
  }
  return s;
}

std::string S3Settings::describe() const {
  std::string key_tail = access_key_id.size() > 4
                             ? "..." + access_key_id.substr(access_key_id.size() - 4)
                             : std::string("...");
  return "endpoint " + endpoint + (path_style ? " (path-style)" : " (virtual-host)") + ", region " +
         region + ", credentials from " + credentials_source + " (key " + key_tail +
         (session_token.empty() ? ")" : ", with session token)");
}

}  // namespace gpurun

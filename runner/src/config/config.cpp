// run.yaml: one schema table (kSchema) and everything driven by it (config.h).
//
// A value travels as a YAML node (from the file, from a --set, or from a manifest's JSON,
// which is YAML too) together with the place it came from; assign() (value.h) converts it to the
// key's type and checks its limit, then cross-key rules run on the whole RunConfig.
#include "gpurun/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <variant>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "config/rules.h"
#include "config/schema.h"
#include "config/shown.h"
#include "config/suggest.h"
#include "config/value.h"
#include "gpurun/errors.h"
#include "util/hash.h"
#include "util/text.h"
#include "util/units.h"

namespace gpurun {
namespace {

using json = nlohmann::json;
using detail::assign;
using detail::edit_distance;
using detail::extends;
using detail::Field;
using detail::format_value;
using detail::Key;
using detail::length_gap;
using detail::Limit;
using detail::nearest_of;
using detail::schema;
using detail::show;
using detail::tolerance;
using detail::value_json;

// const access through the one accessor per key; values read this way are never written.
Field field_of(const Key& key, const RunConfig& c) { return key.field(const_cast<RunConfig&>(c)); }

std::string section_of(const std::string& dotted) { return dotted.substr(0, dotted.find('.')); }
std::string last_of(const std::string& dotted) { return dotted.substr(dotted.rfind('.') + 1); }
/// The key's place in config_to_json()'s nesting: "model.lora.rank" -> /model/lora/rank.
json::json_pointer pointer_of(const std::string& dotted) {
  std::string path = "/" + dotted;
  std::replace(path.begin(), path.end(), '.', '/');
  return json::json_pointer(path);
}
/// True when some key lies under `group` ("model.lora"), which is not a key itself.
bool is_group(const std::string& group) {
  return std::any_of(schema().begin(), schema().end(),
                     [&](const Key& k) { return starts_with(k.name, group + "."); });
}

std::vector<std::string> sections() {
  std::vector<std::string> out;
  for (const Key& k : schema()) {
    if (std::find(out.begin(), out.end(), section_of(k.name)) == out.end()) {
      out.push_back(section_of(k.name));
    }
  }
  return out;
}

const Key* find_key(const std::string& name) {
  for (const Key& k : schema()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

/// The nearest key by full dotted name or by last component (a key put under the wrong
/// section, "optim.epochs"); ties go to the closer full name. Distances are held to the
/// last components' tolerance, as the section prefix would make any two keys look close.
/// Empty when none is reasonably close.
std::string nearest_key(const std::string& wrong) {
  std::pair<size_t, size_t> best{SIZE_MAX, SIZE_MAX};
  std::string found;
  for (const Key& k : schema()) {
    const std::string wrong_last = last_of(wrong), key_last = last_of(k.name);
    const size_t most = tolerance(wrong_last, key_last);
    if (length_gap(wrong, k.name) > most && length_gap(wrong_last, key_last) > most &&
        !extends(wrong_last, key_last))
      continue;
    const size_t full = edit_distance(wrong, k.name);
    const size_t last = edit_distance(wrong_last, key_last);
    if (full > most && last > most && !extends(wrong_last, key_last)) continue;
    const std::pair<size_t, size_t> score{std::min(full, last), full};
    if (score < best) best = score, found = k.name;
  }
  return found;
}

std::string unknown_section_message(const std::string& name) {
  std::string guess = nearest_of(name, sections());
  if (guess.empty() && name.find('.') == std::string::npos) guess = nearest_key(name);
  return "unknown section " + name + (guess.empty() ? "" : "; did you mean " + guess + "?") +
         " (sections: " + join(sections(), ", ") + ")";
}

std::string unknown_key_message(const std::string& name) {
  if (is_group(name)) {
    std::vector<std::string> members;
    for (const Key& k : schema())
      if (starts_with(k.name, name + ".")) members.push_back(last_of(k.name));
    return name + " is a group of keys (" + join(members, ", ") + "), not a value: write " +
           last_of(name) + ": {" + members.front() + ": ...} under " + section_of(name) +
           ":, or --set " + name + "." + members.front() + "=...";
  }
  std::string out = "unknown key " + name;
  const std::string guess = nearest_key(name);
  if (!guess.empty()) return out + "; did you mean " + guess + "?";
  const std::string section = section_of(name);
  std::vector<std::string> keys;
  for (const Key& k : schema()) {
    if (section_of(k.name) == section)
      keys.push_back(std::string(k.name).substr(section.size() + 1));
  }
  if (keys.empty() || name.find('.') == std::string::npos) {
    return out + " (sections: " + join(sections(), ", ") + ")";
  }
  return out + " (" + section + " keys: " + join(keys, ", ") + ")";
}

// --- assembling a RunConfig -----------------------------------------------------------

struct Setting {
  const Key* key;
  YAML::Node value;
  std::string where;  ///< "run.yaml:7", "--set train.epochs=3"
};

/// Values by key in the order they were last set (a later setting replaces an earlier one),
/// plus the errors found so far; build() applies, cross-checks and throws them all at once.
class Assembly {
 public:
  explicit Assembly(std::string source) : source_(std::move(source)) {}

  void set(const Key& key, YAML::Node value, std::string where) {
    // A std::list, because YAML::Node's assignment writes through to the node it refers to:
    // shifting Settings in a vector would overwrite one value of the parsed tree with another.
    settings_.remove_if([&](const Setting& s) { return s.key == &key; });
    settings_.push_back({&key, std::move(value), std::move(where)});
  }
  void fail(const std::string& where, const std::string& message) {
    errors_.push_back(where.empty() ? message : where + ": " + message);
  }
  /// The place of the later-set of `a` and `b`, naming the other's when it differs.
  std::string where(const std::string& a, const std::string& b) const {
    std::vector<std::string> places;
    for (auto it = settings_.rbegin(); it != settings_.rend(); ++it) {
      if (it->key->name == a || it->key->name == b) places.push_back(it->where);
    }
    if (places.empty()) return source_;
    if (places.size() == 1 || places[0] == places[1]) return places[0];
    return places[0] + " (and " + places[1] + ")";
  }

  RunConfig build() {
    RunConfig c;
    c.source = source_;
    for (const Setting& s : settings_) {
      const std::string message = assign(*s.key, s.value, c);
      if (!message.empty()) fail(s.where, message);
    }
    const RuleFailure fail_rule = [&](const std::string& a, const std::string& b,
                                      const std::string& message) { fail(where(a, b), message); };
    if (errors_.empty())
      detail::check_model_source(
          c, [&](const std::string& key) { return is_set(key); }, fail_rule);
    if (errors_.empty()) detail::resolve_metric_goals(c);
    if (errors_.empty()) detail::check_across_keys(c, fail_rule);
    if (!errors_.empty()) throw ConfigError(join(errors_, "\n"));
    return c;
  }

 private:
  using RuleFailure = detail::RuleFailure;
  bool is_set(const std::string& name) const {
    return std::any_of(settings_.begin(), settings_.end(),
                       [&](const Setting& s) { return s.key->name == name; });
  }

  std::string source_;
  std::list<Setting> settings_;
  std::vector<std::string> errors_;
};

std::string at_line(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null()) return source;
  return source + ":" + std::to_string(mark.line + 1);  // yaml-cpp counts lines from 0
}

/// Reads the file's sections (and top-level dotted keys) into `a`.
void read_yaml(const YAML::Node& root, const std::string& source, Assembly& a) {
  if (!root.IsDefined() || root.IsNull()) return;  // an empty file: all defaults
  if (!root.IsMap()) {
    a.fail(at_line(source, root.Mark()),
           "expected a mapping of sections (" + join(sections(), ":, ") + ":), got " + show(root));
    return;
  }
  std::map<std::string, std::string> seen;  // key -> where first set
  const auto add = [&](const std::string& name, const YAML::Node& key, const YAML::Node& value) {
    const std::string where = at_line(source, key.Mark());
    const Key* k = find_key(name);
    const auto [it, fresh] = seen.emplace(name, where);
    if (!k) {
      a.fail(where, unknown_key_message(name));
    } else if (!fresh) {
      a.fail(where, "duplicate key " + name + " (first set at " + it->second + ")");
    } else {
      a.set(*k, value, where);
    }
  };
  const std::vector<std::string> known = sections();
  for (const auto& entry : root) {
    const YAML::Node& key = entry.first;
    const YAML::Node& value = entry.second;
    const std::string where = at_line(source, key.Mark());
    if (!key.IsScalar()) {
      a.fail(where, "expected a section name, got " + show(key));
    } else if (key.Scalar().find('.') != std::string::npos) {
      add(key.Scalar(), key, value);  // "train.epochs: 3" at the top level
    } else if (std::find(known.begin(), known.end(), key.Scalar()) == known.end()) {
      a.fail(where, unknown_section_message(key.Scalar()));
    } else if (value.IsMap()) {
      // A group of keys ("lora:" under "model:") nests one level deeper.
      const std::function<void(const std::string&, const YAML::Node&)> read_map =
          [&](const std::string& prefix, const YAML::Node& map) {
            for (const auto& item : map) {
              if (!item.first.IsScalar()) {
                a.fail(at_line(source, item.first.Mark()),
                       "expected a key, got " + show(item.first));
                continue;
              }
              const std::string name = prefix + "." + item.first.Scalar();
              if (item.second.IsMap() && !find_key(name) && is_group(name))
                read_map(name, item.second);
              else
                add(name, item.first, item.second);
            }
          };
      read_map(key.Scalar(), value);
    } else if (!value.IsNull()) {  // "model:" with nothing under it is fine
      a.fail(where, "section " + key.Scalar() + " must be a mapping of keys, got " + show(value));
    }
  }
}

/// Reads "key=value" overrides into `a`. String keys take the text verbatim (unless quoted),
/// other keys parse it as a YAML scalar or flow node, so "model.hidden=[64,32]" works.
void read_overrides(const std::vector<std::string>& overrides, Assembly& a) {
  for (const std::string& text : overrides) {
    const std::string where = "--set " + text;
    const size_t eq = text.find('=');
    const size_t first = text.find_first_not_of(' ');
    const size_t last = eq == std::string::npos ? eq : text.find_last_not_of(' ', eq - 1);
    if (eq == std::string::npos || eq == 0 || first >= eq || last >= eq) {
      a.fail(where, "expected KEY=VALUE, e.g. --set train.epochs=3");
      continue;
    }
    const std::string name = text.substr(first, last - first + 1), value = text.substr(eq + 1);
    const Key* k = find_key(name);
    if (!k) {
      a.fail(where, unknown_key_message(name));
      continue;
    }
    const bool quoted = !value.empty() && (value[0] == '"' || value[0] == '\'');
    RunConfig probe;  // only to learn the key's type
    if (std::holds_alternative<std::string*>(k->field(probe)) && !quoted) {
      a.set(*k, YAML::Node(value), where);
      continue;
    }
    // A list of patterns given as one bare pattern: --set model.freeze=block0.*
    const size_t start = value.find_first_not_of(' ');
    if (std::holds_alternative<std::vector<std::string>*>(k->field(probe)) && !quoted &&
        start != std::string::npos && value[start] != '[') {
      YAML::Node list(YAML::NodeType::Sequence);
      list.push_back(value.substr(start));
      a.set(*k, list, where);
      continue;
    }
    try {
      a.set(*k, YAML::Load(value), where);
    } catch (const YAML::Exception& e) {
      a.fail(where, "invalid value for " + name + ": " + e.msg);
    }
  }
}

}  // namespace

std::string detail::Limit::describe() const {
  if (!choices.empty()) {
    return (size ? "a size like 24GiB or one of " : "one of ") + join(choices, ", ");
  }
  if (std::isfinite(lo) && std::isfinite(hi)) {
    return std::string("in ") + (lo_open ? "(" : "[") + format_number(lo) + ", " +
           format_number(hi) + (hi_open ? ")" : "]");
  }
  if (std::isfinite(lo) && word)
    return std::string("a number ") + (lo_open ? "> " : ">= ") + format_number(lo) + " or " + word;
  if (std::isfinite(lo)) return (lo_open ? "> " : ">= ") + format_number(lo);
  if (std::isfinite(hi)) return (hi_open ? "< " : "<= ") + format_number(hi);
  return non_empty ? "non-empty" : "";
}

RunConfig parse_config(const std::string& yaml_text, const std::string& source_name,
                       const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(at_line(source_name, e.mark) + ": invalid YAML: " + e.msg);
  }
  Assembly a(source_name);
  read_yaml(root, source_name, a);
  read_overrides(overrides, a);
  return a.build();
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  std::string text;
  int err = file ? 0 : errno;
  if (file) {
    char buf[1 << 16];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, file)) > 0) text.append(buf, n);
    if (std::ferror(file)) err = errno ? errno : EIO;
    std::fclose(file);
  }
  if (err != 0) throw ConfigError("cannot read " + path + ": " + std::strerror(err));
  RunConfig config = parse_config(text, path, overrides);
  std::error_code ec;
  config.base_dir = std::filesystem::absolute(path, ec).parent_path().string();
  return config;
}

std::string config_path(const RunConfig& config, const std::string& path) {
  if (path.empty() || config.base_dir.empty() || std::filesystem::path(path).is_absolute())
    return path;
  return (std::filesystem::path(config.base_dir) / path).lexically_normal().string();
}

nlohmann::json config_to_json(const RunConfig& config) {
  json j = json::object();
  for (const Key& k : schema()) {
    j[pointer_of(k.name)] = value_json(field_of(k, config), k.limit.word);
  }
  j["notify"]["url"] = shown_url(config.notify.url);
  return j;
}

std::string shown_argument(const std::string& arg) {
  static const std::string kKey = "notify.url=";
  const size_t at = arg.find(kKey);
  if (at == std::string::npos) return arg;
  return arg.substr(0, at + kKey.size()) + shown_url(arg.substr(at + kKey.size()));
}

std::string shown_url(const std::string& url) {
  // A webhook's URL is its password (Slack's, Discord's); $NAME only names where it is.
  if (url.empty() || url[0] == '$') return url;
  return kHiddenUrl;
}

RunConfig config_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw ConfigError("config JSON must be an object, got " + j.dump());
  Assembly a("");
  const std::string where = "config JSON";
  std::set<std::string> bad_sections;
  for (const Key& k : schema()) {
    const std::string section = section_of(k.name);
    const auto s = j.find(section);
    if (s == j.end()) continue;  // missing: the default, so older manifests still load
    if (!s->is_object()) {
      if (bad_sections.insert(section).second) {
        a.fail(where, section + " must be an object, got " + s->dump());
      }
      continue;
    }
    const json::json_pointer at = pointer_of(k.name);
    if (!j.contains(at)) continue;  // a key added later: its default
    try {
      a.set(k, YAML::Load(j.at(at).dump()), where);  // JSON is YAML; strings stay quoted
    } catch (const YAML::Exception& e) {
      a.fail(where, std::string(k.name) + ": " + e.msg);
    }
  }
  return a.build();
}

std::vector<std::string> training_keys() {
  std::vector<std::string> keys;
  for (const Key& k : schema()) {
    if (k.hashed) keys.push_back(k.name);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::string config_hash(const RunConfig& config) {
  json j = json::object();  // std::map underneath: dump() is sorted, hence canonical
  for (const Key& k : schema()) {
    if (k.hashed) j[k.name] = value_json(field_of(k, config), k.limit.word);
  }
  return xxh3_hex(j.dump());
}

std::vector<std::string> changed_training_keys(const RunConfig& a, const RunConfig& b) {
  std::vector<std::string> changed;
  for (const Key& k : schema()) {
    if (!k.hashed ||
        value_json(field_of(k, a), k.limit.word) == value_json(field_of(k, b), k.limit.word))
      continue;
    changed.push_back(std::string(k.name) + ": " + format_value(field_of(k, a), k.limit.word) +
                      " -> " + format_value(field_of(k, b), k.limit.word));
  }
  return changed;
}

std::string format_resolved(const RunConfig& config) {
  size_t width = 0;
  for (const Key& k : schema()) width = std::max(width, std::strlen(k.name));
  std::string out =
      config.source.empty() ? "resolved config:\n" : "resolved config (" + config.source + "):\n";
  for (const Key& k : schema()) {
    const std::string value = &k == find_key("notify.url")
                                  ? shown_url(config.notify.url)
                                  : format_value(field_of(k, config), k.limit.word);
    out += "  " + std::string(k.name) + std::string(width + 2 - std::strlen(k.name), ' ') + value +
           "\n";
  }
  return out;
}

std::string format_config_keys() {
  const RunConfig defaults;
  std::string out;
  for (const Key& k : schema()) {
    const std::string limit = k.limit.describe();
    out += std::string(k.name) + " (default " + format_value(field_of(k, defaults), k.limit.word) +
           (limit.empty() ? "" : "; " + limit) + "): " + k.help + "\n";
  }
  return out;
}

}  // namespace gpurun

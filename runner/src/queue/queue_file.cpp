#include "queue/queue_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <map>
#include <set>

#include "config/suggest.h"
#include "gpurun/errors.h"
#include "util/fs.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;

const std::vector<std::string> kTopKeys = {"config", "set", "seeds", "runs", "stop_command"};
const std::vector<std::string> kRunKeys = {"config", "set", "name", "seed"};

/// Parsing state: the file's name for messages and where relative configs are.
struct Context {
  std::string source;
  std::string base_dir;
  bool check_files;

  std::string where(const YAML::Node& n) const {
    const YAML::Mark m = n.Mark();
    if (m.line < 0) return source;
    return source + ":" + std::to_string(m.line + 1);
  }
  /// FILE:LINE:COLUMN: two entries of one flow list share their line.
  std::string where_exactly(const YAML::Node& n) const {
    const YAML::Mark m = n.Mark();
    if (m.line < 0) return source;
    return where(n) + ":" + std::to_string(m.column + 1);
  }
  [[noreturn]] void fail(const YAML::Node& n, const std::string& message) const {
    throw ConfigError(message + " (" + where(n) + ")");
  }
};

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

void check_keys(const Context& c, const YAML::Node& map, const std::vector<std::string>& allowed,
                const std::string& what) {
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) c.fail(kv.first, "a key of " + what + " is not a name");
    const std::string key = kv.first.Scalar();
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    const std::string guess = detail::nearest_of(key, allowed);
    c.fail(kv.first, "unknown key " + key + " in " + what +
                         (guess.empty() ? "" : "; did you mean " + guess + "?") +
                         " (keys: " + join(allowed) + ")");
  }
}

std::string scalar(const Context& c, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar() || n.Scalar().empty()) c.fail(n, key + " must be a non-empty string");
  return n.Scalar();
}

int64_t integer(const Context& c, const YAML::Node& n, const std::string& key) {
  int64_t v = 0;
  if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v))
    c.fail(n, key + " must be an integer, got " + (n.IsScalar() ? n.Scalar() : "a collection"));
  return v;
}

/// A `set:` value: a list of KEY=VALUE strings, or one such string.
std::vector<std::string> sets_of(const Context& c, const YAML::Node& n, const std::string& key) {
  std::vector<std::string> out;
  auto one = [&](const YAML::Node& item) {
    const std::string s = item.IsScalar() ? item.Scalar() : "";
    const size_t eq = s.find('=');
    if (!item.IsScalar() || eq == 0 || eq == std::string::npos)
      c.fail(item, key + " entries are KEY=VALUE strings (e.g. train.epochs=3), got " +
                       (item.IsScalar() ? "\"" + s + "\"" : std::string("a collection")));
    out.push_back(s);
  };
  if (n.IsScalar()) {
    one(n);
  } else if (n.IsSequence()) {
    for (const YAML::Node& item : n) one(item);
  } else if (!n.IsNull()) {
    c.fail(n, key + " must be a list of KEY=VALUE strings");
  }
  return out;
}

std::string config_path(const Context& c, const YAML::Node& n, const std::string& key) {
  const std::string given = scalar(c, n, key);
  stdfs::path p(given);
  if (p.is_relative()) p = stdfs::path(c.base_dir) / p;
  std::error_code ec;
  const stdfs::path abs = stdfs::absolute(p, ec);
  const std::string out = (ec ? p : abs).lexically_normal().string();
  if (c.check_files && !stdfs::is_regular_file(out, ec))
    c.fail(n, key + ": the config " + given + " does not exist (looked for " + out + ")");
  return out;
}

bool name_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         ch == '.' || ch == '_' || ch == '-';
}

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 100 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), name_char);
}

/// A default name from a config's file name: its stem, other characters as '_'.
std::string stem_name(const std::string& config) {
  std::string stem = stdfs::path(config).stem().string();
  for (char& ch : stem)
    if (!name_char(ch)) ch = '_';
  if (stem.empty() || stem[0] == '.') stem = "run" + stem;
  return stem.substr(0, 80);
}

/// A seed as a name's part: "7", and "m7" for -7 ("seed--7" reads as an option's dashes).
std::string seed_part(int64_t seed) {
  return seed < 0 ? "m" + std::to_string(seed).substr(1) : std::to_string(seed);
}

/// "1st", "2nd", "3rd", "4th", ..., "11th", "12th", "13th", "21st".
std::string ordinal(size_t n) {
  const size_t tens = n % 100, ones = n % 10;
  const char* suffix = (tens >= 11 && tens <= 13) ? "th"
                       : ones == 1                ? "st"
                       : ones == 2                ? "nd"
                       : ones == 3                ? "rd"
                                                  : "th";
  return std::to_string(n) + suffix;
}

struct Pending {
  QueueRun run;
  bool named = false;  ///< the name was given, not derived
  YAML::Node node;     ///< for messages
};

}  // namespace

QueueFile parse_queue_text(const std::string& text, const std::string& source,
                           const std::string& base_dir, bool check_files) {
  const Context c{source, base_dir, check_files};
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + " is not valid YAML: " + e.what());
  }
  if (!root.IsMap())
    throw ConfigError(source + " must be a mapping with config:, set:, seeds: and/or runs:");
  std::vector<Pending> runs;
  std::string stop_command;
  try {
    check_keys(c, root, kTopKeys, source);
    if (root["stop_command"]) stop_command = scalar(c, root["stop_command"], "stop_command");
    std::string top_config;
    std::vector<std::string> top_sets;
    if (root["config"]) top_config = config_path(c, root["config"], "config");
    if (root["set"]) top_sets = sets_of(c, root["set"], "set");
    if (const YAML::Node seeds = root["seeds"]) {
      if (!seeds.IsSequence()) c.fail(seeds, "seeds must be a list of integers, e.g. [1, 2, 3]");
      if (top_config.empty()) c.fail(seeds, "seeds: needs a config: for its runs");
      // A seed given twice would train the same run twice under two names: a mistake.
      std::map<int64_t, std::pair<size_t, YAML::Node>> first_of;
      size_t index = 0;
      for (const YAML::Node& s : seeds) {
        const int64_t seed = integer(c, s, "seeds");
        ++index;
        const auto [it, fresh] = first_of.emplace(seed, std::make_pair(index, s));
        if (!fresh)
          throw ConfigError(
              "seeds lists " + std::to_string(seed) + " twice: its " + ordinal(it->second.first) +
              " entry (" + c.where_exactly(it->second.second) + ") and its " + ordinal(index) +
              " (" + c.where_exactly(s) + "); each seed makes one run: remove one of them");
        Pending p{{"seed-" + seed_part(seed), top_config, top_sets, seed}, true, s};
        p.run.sets.push_back("train.seed=" + std::to_string(seed));
        runs.push_back(std::move(p));
      }
    }
    if (const YAML::Node list = root["runs"]) {
      if (!list.IsSequence()) c.fail(list, "runs must be a list of {config, set, name, seed}");
      size_t index = 0;
      for (const YAML::Node& r : list) {
        const std::string what = "runs[" + std::to_string(index++) + "]";
        if (!r.IsMap()) c.fail(r, what + " must be a mapping {config, set, name, seed}");
        check_keys(c, r, kRunKeys, what);
        Pending p{{"", top_config, top_sets, std::nullopt}, false, r};
        if (r["config"]) p.run.config_path = config_path(c, r["config"], what + ".config");
        if (p.run.config_path.empty())
          c.fail(r, what + " has no config: and the queue gives none at the top");
        if (r["set"]) {
          for (std::string& s : sets_of(c, r["set"], what + ".set"))
            p.run.sets.push_back(std::move(s));
        }
        if (r["seed"]) {
          p.run.seed = integer(c, r["seed"], what + ".seed");
          p.run.sets.push_back("train.seed=" + std::to_string(*p.run.seed));
        }
        if (r["name"]) {
          p.run.name = scalar(c, r["name"], what + ".name");
          if (!valid_name(p.run.name))
            c.fail(r["name"], what + ".name \"" + p.run.name +
                                  "\" must be a file name: letters, digits, '.', '_', '-', not "
                                  "starting with '.', at most 100 characters");
          p.named = true;
        } else {
          p.run.name =
              stem_name(p.run.config_path) + (p.run.seed ? "-seed-" + seed_part(*p.run.seed) : "");
        }
        runs.push_back(std::move(p));
      }
    }
    if (!root["seeds"] && !root["runs"] && !top_config.empty()) {
      // A config alone (with its set:) is a queue of one run.
      runs.push_back({{stem_name(top_config), top_config, top_sets, std::nullopt}, false, root});
    }
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ": " + e.what());
  }
  if (runs.empty())
    throw ConfigError(source + " defines no runs: give config: with seeds: [...], or runs: [...]");

  // Derived names that repeat get their position among those that share them: run-1, run-2.
  std::map<std::string, int> derived_count, derived_seen;
  for (const Pending& p : runs)
    if (!p.named) ++derived_count[p.run.name];
  std::map<std::string, const Pending*> by_name;
  QueueFile out;
  out.path = source;
  out.stop_command = stop_command;
  for (Pending& p : runs) {
    if (!p.named && derived_count[p.run.name] > 1)
      p.run.name += "-" + std::to_string(++derived_seen[p.run.name]);
    const auto [it, fresh] = by_name.emplace(p.run.name, &p);
    if (!fresh)
      c.fail(p.node, "two runs are named " + p.run.name + " (the other at " +
                         c.where(it->second->node) + "): give each a name: of its own");
    out.runs.push_back(p.run);
  }
  return out;
}

QueueFile load_queue_file(const std::string& path) {
  std::string text;
  try {
    text = fs::read_file(path);
  } catch (const IoError& e) {
    throw ConfigError("cannot read the queue file: " + std::string(e.what()));
  }
  // Absolute, so that queue.json and `gpurun status` name the file from any directory.
  std::error_code ec;
  const stdfs::path absolute = stdfs::absolute(path, ec);
  const std::string named = ec ? path : absolute.lexically_normal().string();
  std::string base = stdfs::path(named).parent_path().string();
  if (base.empty()) base = ".";
  return parse_queue_text(text, named, base, /*check_files=*/true);
}

}  // namespace gpurun

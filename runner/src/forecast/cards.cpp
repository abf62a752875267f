#include "forecast/cards.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "config/suggest.h"
#include "forecast/bundled_cards.h"
#include "gpurun/errors.h"
#include "util/units.h"

namespace gpurun {
namespace {

const std::vector<std::string> kKeys = {"name", "memory", "bf16_tflops", "fp32_tflops",
                                        "price_per_hour"};

/// A finite number > 0 (>= 0 with `zero_allowed`: a price of a machine of one's own).
double number(const YAML::Node& n, const std::string& where, bool zero_allowed = false) {
  double v = 0;
  try {
    v = n.as<double>();
  } catch (const YAML::Exception&) {
    throw ConfigError(where + ": expected a number, got \"" + (n.IsScalar() ? n.Scalar() : "") +
                      "\"");
  }
  if (!std::isfinite(v) || v < 0 || (v == 0 && !zero_allowed))
    throw ConfigError(where +
                      (zero_allowed ? ": must be a finite number >= 0, got "
                                    : ": must be a finite number > 0, got ") +
                      n.Scalar());
  return v;
}

}  // namespace

std::vector<Card> parse_cards(const std::string& yaml_text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(origin + ": not YAML: " + e.what());
  }
  if (!root.IsMap()) throw ConfigError(origin + ": expected a map with a list \"cards:\"");
  for (const auto& top : root) {
    const std::string key = top.first.as<std::string>();
    if (key != "cards")
      throw ConfigError(
          origin + ": unknown key " + key +
          (detail::nearest_of(key, {"cards"}).empty() ? "" : "; did you mean cards?") +
          " (the file holds one list, cards:)");
  }
  if (!root["cards"]) throw ConfigError(origin + ": expected a map with a list \"cards:\"");
  const YAML::Node list = root["cards"];
  if (!list.IsSequence() || list.size() == 0)
    throw ConfigError(origin + ": cards: expected a list of at least one card");
  std::vector<Card> cards;
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node n = list[i];
    std::string where = origin + ": card " + std::to_string(i + 1);
    if (!n.IsMap()) throw ConfigError(where + ": expected {name: ..., memory: ..., ...}");
    std::set<std::string> keys;
    for (const auto& kv : n) {
      const std::string key = kv.first.as<std::string>();
      // yaml-cpp keeps the first of two equal keys and drops the other without a word.
      if (!keys.insert(key).second)
        throw ConfigError(where + ": key " + key + " is given twice (line " +
                          std::to_string(kv.first.Mark().line + 1) + ")");
      if (std::find(kKeys.begin(), kKeys.end(), key) != kKeys.end()) continue;
      const std::string guess = detail::nearest_of(key, kKeys);
      throw ConfigError(where + ": unknown key " + key +
                        (guess.empty() ? "" : "; did you mean " + guess + "?") + " (keys: name, " +
                        "memory, bf16_tflops, fp32_tflops, price_per_hour)");
    }
    Card c;
    if (!n["name"] || !n["name"].IsScalar() || n["name"].Scalar().empty())
      throw ConfigError(where + ": needs a name");
    c.name = n["name"].Scalar();
    where += " (" + c.name + ")";
    if (!names.insert(c.name).second) throw ConfigError(where + ": the name is given twice");
    if (!n["memory"] || !n["memory"].IsScalar())
      throw ConfigError(where + ": needs memory: a SIZE, e.g. 24GiB");
    try {
      c.memory_bytes = parse_size(n["memory"].Scalar());
    } catch (const ConfigError& e) {
      throw ConfigError(where + ": memory: " + e.what());
    }
    if (c.memory_bytes < (int64_t{1} << 20))
      throw ConfigError(where + ": memory " + n["memory"].Scalar() + " is under 1 MiB; a SIZE " +
                        "takes a unit, e.g. 24GiB");
    if (!n["bf16_tflops"]) throw ConfigError(where + ": needs bf16_tflops");
    c.bf16_tflops = number(n["bf16_tflops"], where + ": bf16_tflops");
    if (n["fp32_tflops"]) c.fp32_tflops = number(n["fp32_tflops"], where + ": fp32_tflops");
    if (n["price_per_hour"])
      c.price_per_hour = number(n["price_per_hour"], where + ": price_per_hour", true);
    cards.push_back(c);
  }
  return cards;
}

std::vector<Card> load_cards(const std::string& path) {
  std::ifstream in(path);
  if (!in || std::filesystem::is_directory(path))
    throw ConfigError(
        "--cards " + path + ": cannot be read (" +
        (std::filesystem::is_directory(path) ? std::string("a directory") : std::strerror(errno)) +
        ")");
  std::stringstream text;
  text << in.rdbuf();
  return parse_cards(text.str(), path);
}

std::string smallest_card_for(const std::vector<Card>& cards, int64_t need_bytes, double headroom) {
  const Card* best = nullptr;
  for (const Card& c : cards)
    if (static_cast<double>(c.memory_bytes) * (1.0 - headroom) >= static_cast<double>(need_bytes) &&
        (!best || c.memory_bytes < best->memory_bytes))
      best = &c;
  return best ? best->name + " (" + format_bytes(best->memory_bytes) + ")" : "";
}

const std::vector<Card>& bundled_cards() {
  static const std::vector<Card> cards = parse_cards(kBundledCardsYaml, "the bundled cards");
  return cards;
}

}  // namespace gpurun

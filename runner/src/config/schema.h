// The schema of run.yaml: one line per key (config_schema.cpp), read by config.cpp. Private
// to gpurun_core: the public interface is config.h.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "gpurun/config.h"

namespace gpurun::detail {

/// Where a key's value lives in RunConfig; the alternative held is the key's type.
using Field = std::variant<int64_t*, double*, bool*, std::string*, std::vector<int64_t>*,
                           std::vector<std::string>*, std::vector<double>*>;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// What a key accepts beyond its type. Bounds apply to ints, floats and every element of an
/// int or float list; `choices` to strings; `size` marks a SIZE string (parse_size) or one of
/// `choices`.
struct Limit {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  bool non_empty = false;  ///< strings and lists
  bool size = false;
  std::vector<std::string> choices;
  /// A number key that also takes this one word, held as kAutoInterval (NaN) by a float key
  /// and as kAutoCount (-1) by an integer key; null: none.
  const char* word = nullptr;

  bool admits(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  std::string describe() const;
};

struct Key {
  const char* name;  ///< dotted: section.member, or section.group.member (model.lora.rank)
  Field (*field)(RunConfig&);
  Limit limit;
  const char* help;
  bool hashed;
};

/// Every key, in the order format_resolved() prints them.
const std::vector<Key>& schema();

}  // namespace gpurun::detail

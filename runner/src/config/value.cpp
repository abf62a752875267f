// run.yaml's values: a YAML node converted to its key's type and checked against the key's
// limit, and a value written back as run.yaml and JSON show it.
#include "config/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "config/suggest.h"
#include "gpurun/errors.h"
#include "util/units.h"

namespace gpurun::detail {
namespace {

using json = nlohmann::json;

bool plain(const YAML::Node& n) { return n.IsScalar() && n.Tag() != "!"; }  // not quoted

/// A plain decimal integer that fits in int64_t; nullopt otherwise. `out_of_range`, when
/// given, is set to whether `n` is written as an integer but does not fit.
std::optional<int64_t> to_int(const YAML::Node& n, bool* out_of_range = nullptr) {
  if (out_of_range) *out_of_range = false;
  if (!plain(n)) return std::nullopt;
  const std::string& s = n.Scalar();
  const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
  const char* end = s.data() + s.size();
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, v);
  const bool integer = begin != end && !(*begin == '-' && begin != s.data()) && ptr == end;
  if (!integer || ec != std::errc()) {
    if (out_of_range) *out_of_range = integer && ec == std::errc::result_out_of_range;
    return std::nullopt;
  }
  return v;
}

// YAML floats (1e-3, 0.5, 3) in the C locale; nan and inf are refused. `out_of_range`, when
// given, is set to whether `n` is written as a number beyond a double's range (1e999, 1e-999).
std::optional<double> to_double(const YAML::Node& n, bool* out_of_range = nullptr) {
  if (out_of_range) *out_of_range = false;
  if (!plain(n)) return std::nullopt;
  const std::string& s = n.Scalar();
  const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
  const char* end = s.data() + s.size();
  double v = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, v);
  if (begin == end || ec != std::errc() || ptr != end || !std::isfinite(v)) {
    if (out_of_range)
      *out_of_range = begin != end && ptr == end && ec == std::errc::result_out_of_range;
    return std::nullopt;
  }
  return v;
}

/// The integers `limit` admits within int64_t, as "from 1 to 9223372036854775807".
std::string integer_range(const Limit& limit) {
  int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  if (std::isfinite(limit.lo))
    lo = static_cast<int64_t>(limit.lo_open ? std::floor(limit.lo) + 1 : std::ceil(limit.lo));
  if (std::isfinite(limit.hi))
    hi = static_cast<int64_t>(limit.hi_open ? std::ceil(limit.hi) - 1 : std::floor(limit.hi));
  return "from " + std::to_string(lo) + " to " + std::to_string(hi);
}

std::optional<bool> to_bool(const YAML::Node& n) {
  if (!plain(n)) return std::nullopt;
  const std::string& s = n.Scalar();
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

/// The offset of the first byte of `s` that does not belong to valid UTF-8 (RFC 3629: no
/// overlong forms, no surrogates, nothing above U+10FFFF), or npos when there is none.
size_t invalid_utf8_at(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char b = byte(i);
    size_t length = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (b < 0x80) {
      length = 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      length = 3;
      if (b == 0xE0) lo = 0xA0;  // overlong
      if (b == 0xED) hi = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      length = 4;
      if (b == 0xF0) lo = 0x90;  // overlong
      if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + length > s.size()) return i;
    for (size_t k = 1; k < length; ++k) {
      const unsigned char c = byte(i + k);
      if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return i;
    }
    i += length;
  }
  return std::string::npos;
}

/// `s` as a JSON string; bytes that are not UTF-8 become U+FFFD (dump() would throw).
std::string json_quoted(const std::string& s) {
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string format_value(const Field& f, const char* word) {
  if (auto* i = std::get_if<int64_t*>(&f))
    return word && **i == kAutoCount ? std::string(word) : std::to_string(**i);
  if (auto* d = std::get_if<double*>(&f)) return std::isnan(**d) ? "auto" : json(**d).dump();
  if (auto* b = std::get_if<bool*>(&f)) return **b ? "true" : "false";
  if (auto* s = std::get_if<std::string*>(&f)) return (*s)->empty() ? "\"\"" : **s;
  if (auto* l = std::get_if<std::vector<std::string>*>(&f)) return json(**l).dump();
  if (auto* l = std::get_if<std::vector<double>*>(&f)) {
    std::string items;
    for (double v : **l) items += (items.empty() ? "" : ", ") + json(v).dump();
    return "[" + items + "]";
  }
  std::string items;
  for (int64_t v : *std::get<std::vector<int64_t>*>(f))
    items += (items.empty() ? "" : ", ") + std::to_string(v);
  return "[" + items + "]";
}

json value_json(const Field& f, const char* word) {
  // A NaN float is the word of a number-or-word key (kAutoInterval).
  if (auto* d = std::get_if<double*>(&f); d && std::isnan(**d)) return json("auto");
  // An integer key's word is kAutoCount.
  if (auto* i = std::get_if<int64_t*>(&f); i && word && **i == kAutoCount) return json(word);
  return std::visit([](auto* p) { return json(*p); }, f);
}

/// A node as the user wrote it: numbers bare, text quoted, lists and maps in flow style.
std::string show(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "nothing";
  if (n.IsScalar()) {
    return to_double(n) || to_bool(n) ? n.Scalar() : json_quoted(n.Scalar());
  }
  YAML::Emitter out;
  out.SetSeqFormat(YAML::Flow);
  out.SetMapFormat(YAML::Flow);
  out << n;
  return out.c_str();
}

/// Converts `n` to the key's type and checks its limit; on success stores it in `c` and
/// returns "", otherwise returns the message (without the location).
std::string assign(const Key& key, const YAML::Node& n, RunConfig& c) {
  const Limit& limit = key.limit;
  const Field f = key.field(c);
  const std::string name = key.name;
  const auto type_error = [&](const char* what) {
    return name + " must be " + what + ", got " + show(n);
  };
  const auto range_error = [&](const std::string& got) {
    return name + " must be " + limit.describe() + ", got " + got;
  };
  // A number too large for its type is not of a wrong type but beyond any limit.
  bool out_of_range = false;
  if (auto* i = std::get_if<int64_t*>(&f)) {
    if (limit.word && n.IsScalar() && n.Scalar() == limit.word) {
      **i = kAutoCount;
      return "";
    }
    const auto v = to_int(n, &out_of_range);
    if (out_of_range) {
      return name + " is out of range: must be an integer " + integer_range(limit) + ", got " +
             n.Scalar();
    }
    if (!v && limit.word) {
      const std::string guess = n.IsScalar() ? nearest_of(n.Scalar(), {limit.word}) : "";
      return range_error(show(n)) + (guess.empty() ? "" : "; did you mean " + guess + "?");
    }
    if (!v) return type_error("an integer");
    if (!limit.admits(static_cast<double>(*v))) {
      if (std::isfinite(limit.lo) && std::isfinite(limit.hi))
        return name + " must be an integer " + integer_range(limit) + ", got " + std::to_string(*v);
      return range_error(std::to_string(*v));
    }
    **i = *v;
  } else if (auto* d = std::get_if<double*>(&f)) {
    if (limit.word && n.IsScalar() && n.Scalar() == limit.word) {
      **d = kAutoInterval;
      return "";
    }
    const auto v = to_double(n, &out_of_range);
    if (out_of_range) {
      return name + " is out of range of a double (0, or magnitudes 2.2e-308 to 1.8e308), got " +
             n.Scalar();
    }
    if (!v && limit.word) {
      const std::string guess = n.IsScalar() ? nearest_of(n.Scalar(), {limit.word}) : "";
      return range_error(show(n)) + (guess.empty() ? "" : "; did you mean " + guess + "?");
    }
    if (!v) return type_error("a number");
    if (!limit.admits(*v)) return range_error(json(*v).dump());
    **d = *v;
  } else if (auto* b = std::get_if<bool*>(&f)) {
    const auto v = to_bool(n);
    if (!v) return type_error("true or false");
    **b = *v;
  } else if (auto* s = std::get_if<std::string*>(&f)) {
    if (!n.IsScalar()) return type_error("a string");
    const std::string& v = n.Scalar();
    // The config is stored as JSON in every manifest and hashed as JSON, and JSON is UTF-8.
    if (const size_t at = invalid_utf8_at(v); at != std::string::npos) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(v[at]));
      return name + " must be UTF-8 text, got " + show(n) + " (byte " + std::to_string(at) +
             " is " + hex + ")";
    }
    const bool listed =
        std::find(limit.choices.begin(), limit.choices.end(), v) != limit.choices.end();
    if (limit.size && !listed) {
      try {
        parse_size(v);
      } catch (const ConfigError&) {
        return range_error(show(n));
      }
    } else if (!limit.choices.empty() && !listed && !(v.empty() && !limit.non_empty)) {
      // A key of choices that may be empty takes "" as off (checkpoint.keep_best.metric).
      const std::string guess = nearest_of(v, limit.choices);
      return range_error(show(n)) + (guess.empty() ? "" : "; did you mean " + guess + "?");
    } else if (limit.non_empty && v.empty()) {
      return name + " must not be empty";
    }
    **s = v;
  } else if (auto* l = std::get_if<std::vector<std::string>*>(&f)) {
    // The example is one of the key's choices where it has them (notify.on), else a pattern.
    const std::string example =
        "[\"" + (limit.choices.empty() ? std::string("block0.*") : limit.choices.front()) + "\"]";
    const std::string what =
        (limit.non_empty ? "a non-empty list of strings like " : "a list of strings like ") +
        example;
    if (!n.IsSequence() || (limit.non_empty && n.size() == 0)) return type_error(what.c_str());
    std::vector<std::string> values;
    for (const YAML::Node& item : n) {
      if (!item.IsScalar() || item.Scalar().empty()) return type_error(what.c_str());
      if (invalid_utf8_at(item.Scalar()) != std::string::npos)
        return name + " must be UTF-8 text, got " + show(n);
      if (!limit.choices.empty() && std::find(limit.choices.begin(), limit.choices.end(),
                                              item.Scalar()) == limit.choices.end()) {
        const std::string guess = nearest_of(item.Scalar(), limit.choices);
        return name + " has " + show(item) + ", which is not " + limit.describe() +
               (guess.empty() ? "" : "; did you mean " + guess + "?");
      }
      values.push_back(item.Scalar());
    }
    **l = std::move(values);
  } else if (auto* numbers = std::get_if<std::vector<double>*>(&f)) {
    const char* what = "a list of numbers like [0.485, 0.456, 0.406]";
    if (!n.IsSequence() || (limit.non_empty && n.size() == 0)) return type_error(what);
    std::vector<double> values;
    for (const YAML::Node& item : n) {
      const auto v = to_double(item);
      if (!v) return type_error(what);
      if (!limit.admits(*v))
        return name + " must be a list of numbers " + limit.describe() + ", got " + show(n);
      values.push_back(*v);
    }
    **numbers = std::move(values);
  } else {
    const char* what = "a non-empty list of integers like [64, 32]";
    if (!n.IsSequence() || (limit.non_empty && n.size() == 0)) return type_error(what);
    std::vector<int64_t> values;
    for (const YAML::Node& item : n) {
      const auto v = to_int(item, &out_of_range);
      if (out_of_range) {
        return name + " is out of range: must be a list of integers " + integer_range(limit) +
               ", got " + show(n);
      }
      if (!v) return type_error(what);
      if (!limit.admits(static_cast<double>(*v))) {
        return name + " must be a list of integers " + limit.describe() + ", got " + show(n);
      }
      values.push_back(*v);
    }
    *std::get<std::vector<int64_t>*>(f) = std::move(values);
  }
  return "";
}

}  // namespace gpurun::detail

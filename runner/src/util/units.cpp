#include "util/units.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>

#include "gpurun/errors.h"

namespace gpurun {

int64_t parse_size(const std::string& text) {
  const auto invalid = [&] {
    return ConfigError("invalid size \"" + text +
                       "\"; use a byte count or a unit: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB "
                       "(in any case: 8gib is 8GiB, 8gb is 8GB)");
  };
  // Upper case: the unit is matched case-insensitively (a size is never in bits here).
  static const std::map<std::string, double> kUnits = {
      {"", 1},         {"B", 1},    {"KIB", 0x1p10}, {"MIB", 0x1p20}, {"GIB", 0x1p30},
      {"TIB", 0x1p40}, {"KB", 1e3}, {"MB", 1e6},     {"GB", 1e9},     {"TB", 1e12}};
  const size_t begin = text.find_first_not_of(' ');
  if (begin == std::string::npos) throw invalid();
  size_t end = begin;
  while (end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) {
    ++end;
  }
  const std::string number = text.substr(begin, end - begin);
  const size_t unit_begin = std::min(text.find_first_not_of(' ', end), text.size());
  const size_t unit_end = text.find_last_not_of(' ') + 1;
  std::string unit_text = text.substr(unit_begin, std::max(unit_end, unit_begin) - unit_begin);
  for (char& c : unit_text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const auto unit = kUnits.find(unit_text);
  const bool fractional = number.find('.') != std::string::npos;
  if (number.empty() || number == "." || std::count(number.begin(), number.end(), '.') > 1 ||
      unit == kUnits.end() || (fractional && unit->second == 1)) {
    throw invalid();
  }
  if (unit->second == 1) {  // exact, also above 2^53
    int64_t bytes = 0;
    const auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), bytes);
    if (ec != std::errc() || ptr != number.data() + number.size()) throw invalid();
    return bytes;
  }
  const double bytes = std::strtod(number.c_str(), nullptr) * unit->second;
  if (!(bytes < 0x1p63)) throw invalid();
  return std::llround(bytes);
}

std::string format_bytes(int64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes > -1024 && bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024;
  size_t u = 0;
  while (std::fabs(v) >= 1024 && u + 1 < std::size(kUnits)) v /= 1024, ++u;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

std::string format_seconds(double seconds) {
  char buf[48];
  std::snprintf(buf, sizeof buf, seconds >= 10 ? "%.0f" : "%.1f", seconds);
  return buf;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%llds", s);
  return buf;
}

}  // namespace gpurun

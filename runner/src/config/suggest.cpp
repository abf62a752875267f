#include "config/suggest.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <vector>

namespace gpurun::detail {

// Levenshtein distance where swapping two neighbours also counts 1 ("modle" ~ "model"): the
// optimal-string-alignment variant, case-insensitive ("SGD" ~ "sgd").
size_t edit_distance(const std::string& a, const std::string& b) {
  const auto same = [&](size_t i, size_t j) {
    return std::tolower(static_cast<unsigned char>(a[i])) ==
           std::tolower(static_cast<unsigned char>(b[j]));
  };
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + !same(i - 1, j - 1)});
      if (i > 1 && j > 1 && same(i - 1, j - 2) && same(i - 2, j - 1)) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// How far apart two names may be to suggest one for the other: a third of the shorter's
// length, at least 1 ("epoch" ~ "epochs"; not "lr" ~ "gamma").
size_t tolerance(const std::string& a, const std::string& b) {
  return std::max<size_t>(1, std::min(a.size(), b.size()) / 3);
}

// One name starts the other, and is not too short to mean much: "optimizer" ~ "optim".
bool extends(const std::string& a, const std::string& b) {
  const std::string& shorter = a.size() < b.size() ? a : b;
  const std::string& longer = a.size() < b.size() ? b : a;
  return shorter.size() >= 4 && longer.compare(0, shorter.size(), shorter) == 0;
}

/// At least the edit distance of `a` and `b`: the difference of their lengths. Checked before
/// edit_distance(), whose cost grows with the product of the lengths: a key or value pasted by
/// mistake (kilobytes of text) would otherwise take seconds to be told it is unknown.
size_t length_gap(const std::string& a, const std::string& b) {
  return a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
}

std::string nearest_of(const std::string& wrong, const std::vector<std::string>& names) {
  size_t best = SIZE_MAX;
  std::string found;
  for (const std::string& name : names) {
    if (length_gap(wrong, name) > tolerance(wrong, name) && !extends(wrong, name)) continue;
    const size_t d = edit_distance(wrong, name);
    if ((d <= tolerance(wrong, name) || extends(wrong, name)) && d < best) best = d, found = name;
  }
  return found;
}

}  // namespace gpurun::detail

// Nearest names for "did you mean ...?" messages (config keys, sections, choices). Private to
// gpurun_core.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace gpurun::detail {

/// Levenshtein distance where swapping two neighbours also counts 1 ("modle" ~ "model"): the
/// optimal-string-alignment variant (Damerau 1964), case-insensitive ("SGD" ~ "sgd").
size_t edit_distance(const std::string& a, const std::string& b);

/// How far apart two names may be to suggest one for the other: a third of the shorter's
/// length, at least 1 ("epoch" ~ "epochs"; not "lr" ~ "gamma").
size_t tolerance(const std::string& a, const std::string& b);

/// One name starts the other and is not too short to mean much: "optimizer" ~ "optim".
bool extends(const std::string& a, const std::string& b);

/// The difference of the lengths of `a` and `b`: a lower bound of their edit distance, checked
/// first, as edit_distance() costs the product of the lengths.
size_t length_gap(const std::string& a, const std::string& b);

/// The name of `names` nearest to `wrong` within tolerance(), for "did you mean"; "" when none.
std::string nearest_of(const std::string& wrong, const std::vector<std::string>& names);

}  // namespace gpurun::detail

// Comparisons shared by the unit tests.
#pragma once

#include <algorithm>

#include <ATen/core/Tensor.h>

namespace gpurun::test {

/// ||a - b|| / ||b||: the norm-wise relative difference that the tolerances of
/// docs/architecture.md's cases use.
inline double relative_norm_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(1e-30, b.norm().item<double>());
}

}  // namespace gpurun::test

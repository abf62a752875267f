// The weights of a run's newest checkpoint, for integration tests that compare two runs.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include <ATen/ops/pow.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/sum.h>

#include "checkpoint/format/pickle.h"
#include "integration/harness.h"

namespace gpurun::test {

/// model.pt of the newest complete checkpoint in `ckpt`.
inline gpurun::NamedTensors newest_weights(const std::string& ckpt) {
  std::string latest = slurp(ckpt + "/LATEST");
  latest.erase(latest.find_last_not_of(" \n") + 1);
  return gpurun::unpickle_tensors(slurp(ckpt + "/" + latest + "/model.pt"), latest + "/model.pt");
}

inline double relative_norm_difference(const gpurun::NamedTensors& a,
                                       const gpurun::NamedTensors& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += at::sub(a[i].second, b[i].second).pow(2).sum().item<double>();
    norm += b[i].second.pow(2).sum().item<double>();
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

}  // namespace gpurun::test

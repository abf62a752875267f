// model_digest() (gpurun/model.h) of a state_dict() already taken: a checkpoint save digests
// its host copy on the writer thread, and must give the digest of the live model.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace gpurun {

/// xxh3-64 (16 hex digits) over the raw bytes of every tensor of `state`, in order.
std::string state_digest(const std::vector<std::pair<std::string, at::Tensor>>& state);

}  // namespace gpurun

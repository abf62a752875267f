#include "memory/rank_state.h"

#include <algorithm>
#include <stdexcept>

#include "gpurun/model.h"
#include "optim/flat_layout.h"

namespace gpurun {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

bool adam(const OptimConfig& optim) { return optim.name == "adam" || optim.name == "adamw"; }

}  // namespace

int64_t StateShape::numel() const {
  int64_t n = 0;
  for (const auto& entry : trainable) n += numel_of(entry.second);
  return n;
}

int64_t StateShape::matrix_numel() const {
  int64_t n = 0;
  for (const auto& entry : trainable)
    if (entry.second.size() >= 2) n += numel_of(entry.second);
  return n;
}

int64_t StateShape::largest_numel() const {
  int64_t n = 0;
  for (const auto& entry : trainable) n = std::max(n, numel_of(entry.second));
  return n;
}

StateShape state_shape(SegmentedModel& model) {
  StateShape shape;
  int64_t all = 0, trainable = 0, all_float = 0, all_float_numel = 0;
  for (const auto& entry : state_dict(model)) {
    all += static_cast<int64_t>(entry.second.nbytes());
    if (!entry.second.is_floating_point()) continue;
    all_float += static_cast<int64_t>(entry.second.nbytes());
    all_float_numel += entry.second.numel();
  }
  for (const auto& item : model.named_parameters()) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    shape.trainable.emplace_back(item.key(), p.sizes().vec());
    shape.trainable_element_bytes = static_cast<int64_t>(p.element_size());
    trainable += static_cast<int64_t>(p.nbytes());
  }
  shape.other_bytes = all - trainable;
  shape.other_float_bytes = all_float - trainable;
  shape.other_float_numel = all_float_numel - shape.numel();
  return shape;
}

Estimate rank_state(const StateShape& shape, const OptimConfig& optim, Precision precision,
                    const OptimizerPlacement& placement, int64_t world_size) {
  if (world_size < 1)
    throw std::invalid_argument("rank_state: world size " + std::to_string(world_size));
  const int64_t half = precision == Precision::kFp32 ? 0 : 2;  // bf16 and fp16: 2 bytes
  const int64_t elem = shape.trainable_element_bytes;
  Estimate e;
  if (!placement.flat()) {
    // LibTorch's optimizer on every rank: memory/peak_probe.h's estimate_state().
    const int64_t psi = shape.numel();
    e.parameters = shape.other_bytes + elem * psi;
    e.gradients = elem * psi;
    e.weight_casts = half * shape.matrix_numel();
    const int64_t largest = elem * shape.largest_numel();
    if (adam(optim)) {
      e.optimizer_state = 2 * e.gradients;
      e.optimizer_temporaries = 2 * largest;
    } else {
      if (optim.momentum > 0) e.optimizer_state = e.gradients;
      if (optim.weight_decay > 0) e.optimizer_temporaries = largest;
    }
    return e;
  }
  const FlatLayout layout(shape.trainable, world_size);
  const int64_t p = layout.padded_numel(), s = layout.shard_numel();
  const bool master = placement.master_weights && half > 0;
  const int64_t w = master ? half : elem;
  const int64_t others =
      master ? shape.other_bytes - shape.other_float_bytes + half * shape.other_float_numel
             : shape.other_bytes;
  e.parameters = others + w * p;
  e.gradients = w * p;
  e.gradients_released = placement.shard == "gradients";
  // The fp32 gradient slice: with one process and fp32 gradients it is the gradient buffer
  // itself (FlatOptimizer::reduce_gradients), 16-bit ones are cast into one.
  e.gradient_slice = world_size == 1 && w == 4 ? 0 : 4 * s;
  // Weights held in 16 bits are not cast again; fp32 ones are, as replicated.
  e.weight_casts = master ? 0 : half * shape.matrix_numel();
  const int64_t moments = adam(optim) ? 8 * s : optim.momentum > 0 ? 4 * s : 0;
  const int64_t master_slice = master || placement.offload ? 4 * s : 0;
  if (placement.offload) {
    e.host_bytes = moments + master_slice + 4 * s;
  } else {
    e.optimizer_state = moments + master_slice;
  }
  // The reduce-scatter's fp32 bucket of N x C (FlatLayout::bucket_columns(), at most 25 MiB):
  // our copy of it (with fp32 gradients in one bucket, the gradient buffer itself), and over
  // Gloo the ring's two chunks of C (the one received, the partial sum sent on); NCCL keeps its
  // buffers outside the caching allocator. Until the ring (Collectives::reduce_scatter), Gloo's
  // copy of the whole input took the place of the two chunks, and on 4 ranks of the gpt of 0.42 M
  // parameters the update's peak was 7.0 or 8.4 MB depending on when Gloo freed it.
  // The all-gather's, after the update (the gradient slice is gone by then): the send buffer
  // of a bucket's columns of this rank's weights, and with more than one bucket the gathered
  // rows of every rank before they are copied into the parameter buffer.
  if (world_size > 1) {
    const int64_t c = std::min(layout.bucket_columns(), s);
    e.optimizer_temporaries = 4 * world_size * c + 8 * c;
    const int64_t gather = w * c + (c < s ? world_size * w * c : 0);
    e.optimizer_temporaries = std::max(e.optimizer_temporaries, gather - e.gradient_slice);
  }
  // Clipping's float64 copy of one chunk of the slice, after the buckets are gone.
  if (optim.grad_clip > 0)
    e.optimizer_temporaries =
        std::max(e.optimizer_temporaries, 8 * std::min(s, FlatLayout::kClipChunkElements));
  return e;
}

std::string placement_name(const OptimizerPlacement& placement) {
  std::string name = placement.shard == "none" ? "replicated" : placement.shard;
  if (placement.shard == "none" && placement.flat()) name = "flat";
  if (placement.master_weights) name += " + master weights";
  if (placement.offload) name += " + offload";
  return name;
}

}  // namespace gpurun

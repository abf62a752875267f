#include "gpurun/dataset.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/randperm.h>

namespace gpurun {

TensorDataset::TensorDataset(at::Tensor inputs, at::Tensor targets, Transform transform)
    : inputs_(std::move(inputs)), targets_(std::move(targets)), transform_(std::move(transform)) {
  TORCH_CHECK(inputs_.size(0) == targets_.size(0), "TensorDataset: ", inputs_.size(0),
              " inputs but ", targets_.size(0), " targets");
}

int64_t TensorDataset::size() const { return inputs_.size(0); }

Batch TensorDataset::get(const at::Tensor& indices) const {
  at::Tensor x = at::index_select(inputs_, 0, indices);
  if (transform_) x = transform_(x);
  return {x, at::index_select(targets_, 0, indices)};
}

at::Tensor epoch_permutation(int64_t n, int64_t seed, int64_t epoch) {
  // A private generator: the global one also drives dropout, whose state a checkpoint saves;
  // keeping the data order off it makes the order a pure function of (seed, epoch).
  uint64_t mixed =
      static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(mixed);
  return at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
}

uint64_t sample_seed(int64_t seed, int64_t epoch, int64_t position) {
  // SplitMix64's finaliser over each word in turn (Steele et al. 2014): neighbouring
  // positions give unrelated seeds, which the Philox/mt19937 generators they seed expect.
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(static_cast<uint64_t>(seed) + 0x9E3779B97F4A7C15ull);
  h = mix(h ^ (static_cast<uint64_t>(epoch) + 0x9E3779B97F4A7C15ull));
  return mix(h ^ (static_cast<uint64_t>(position) + 0x9E3779B97F4A7C15ull));
}

}  // namespace gpurun

#include "optim/flat_layout.h"

#include <algorithm>
#include <stdexcept>

namespace gpurun {
namespace {

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

ElementRange ElementRange::intersect(const ElementRange& other) const {
  const int64_t b = std::max(begin, other.begin), e = std::min(end, other.end);
  return e > b ? ElementRange{b, e} : ElementRange{b, b};
}

FlatLayout::FlatLayout(const std::vector<std::pair<std::string, std::vector<int64_t>>>& parameters,
                       int64_t world_size)
    : world_size_(world_size) {
  if (world_size < 1)
    throw std::invalid_argument("FlatLayout: world size " + std::to_string(world_size));
  int64_t offset = 0;
  for (const auto& [name, shape] : parameters) {
    int64_t numel = 1;
    for (const int64_t d : shape) {
      if (d < 0) throw std::invalid_argument("FlatLayout: " + name + " has a negative dimension");
      numel *= d;
    }
    parameters_.push_back({name, shape, numel, offset});
    numel_ += numel;
    offset = round_up(offset + numel, kAlignment);
  }
  // At least one aligned unit per rank, so that every rank owns a slice, however small.
  padded_numel_ = round_up(std::max<int64_t>(offset, 1), world_size_ * kAlignment);
}

ElementRange FlatLayout::shard(int64_t rank) const {
  if (rank < 0 || rank >= world_size_)
    throw std::out_of_range("FlatLayout: rank " + std::to_string(rank) + " of " +
                            std::to_string(world_size_));
  return {rank * shard_numel(), (rank + 1) * shard_numel()};
}

std::vector<FlatPiece> FlatLayout::pieces(const ElementRange& flat) const {
  std::vector<FlatPiece> out;
  // The first parameter that ends after flat.begin; offsets increase with the index.
  auto it =
      std::upper_bound(parameters_.begin(), parameters_.end(), flat.begin,
                       [](int64_t b, const FlatParameter& p) { return b < p.offset + p.numel; });
  for (; it != parameters_.end() && it->offset < flat.end; ++it) {
    const ElementRange in_flat = flat.intersect({it->offset, it->offset + it->numel});
    if (in_flat.empty()) continue;
    out.push_back({static_cast<size_t>(it - parameters_.begin()),
                   {in_flat.begin - it->offset, in_flat.end - it->offset},
                   in_flat.begin});
  }
  return out;
}

int64_t FlatLayout::bucket_columns() const {
  return std::max<int64_t>(kAlignment, kBucketBytes / (4 * world_size_) / kAlignment * kAlignment);
}

}  // namespace gpurun

// The trainable parameters as one flat buffer, cut into one contiguous slice per rank: the
// layout of the sharded optimizer (flat_optimizer.h) and of a sharded checkpoint's chunks.
//
// Parameter i occupies elements [offset_i, offset_i + numel_i) of the buffer, in the order
// given (trainable_parameters()' order, the same on every rank). Each offset is a multiple of
// kAlignment elements, and the buffer is padded to a multiple of world_size x kAlignment, so
// that rank r's slice [r x S, (r + 1) x S), S = padded / world_size, starts aligned: a kernel
// that vectorises in chunks from a tensor's start (ATen's fused Adam works in 64-byte units)
// then treats an element of a slice as it treats it in the whole buffer. Megatron-core's
// distributed optimizer pads its buffers likewise (param_and_grad_buffer.py).
// Padding elements belong to no parameter: their gradient is 0, and they are never saved.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpurun {

/// Elements [begin, end) of a flat buffer, or of one tensor's flattened elements.
struct ElementRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  /// The overlap of two ranges (empty when they are disjoint).
  ElementRange intersect(const ElementRange& other) const;
  bool operator==(const ElementRange& o) const { return begin == o.begin && end == o.end; }
};

struct FlatParameter {
  std::string name;            ///< state_dict key, e.g. "block0.attn.weight"
  std::vector<int64_t> shape;  ///< the parameter's shape
  int64_t numel = 0;           ///< elements
  int64_t offset = 0;          ///< first element in the flat buffer (a multiple of kAlignment)
};

/// A part of one parameter inside a range of the flat buffer: elements [param_range) of the
/// parameter's flattened elements are at [flat_begin, flat_begin + param_range.size()).
struct FlatPiece {
  size_t parameter = 0;  ///< index into FlatLayout::parameters()
  ElementRange param_range;
  int64_t flat_begin = 0;
};

class FlatLayout {
 public:
  /// Elements each parameter's offset, and each slice, is a multiple of: 64 x 4 bytes = 256
  /// bytes for fp32, a multiple of every CPU vector width and of a CUDA cache line.
  static constexpr int64_t kAlignment = 64;
  /// The reduce-scatter and the all-gather run in buckets of at most this many bytes of fp32
  /// (DDP's bucket_cap_mb = 25): 16-bit gradients are summed in fp32 without an fp32 copy of
  /// the whole buffer, and a backend's own copy of its input (Gloo's) stays as small.
  static constexpr int64_t kBucketBytes = int64_t{25} << 20;
  /// Gradient clipping squares a slice this many elements at a time, in float64 (32 MiB), so
  /// that the norm of a 7B model's slice needs no float64 copy of it (FlatOptimizer).
  static constexpr int64_t kClipChunkElements = int64_t{1} << 22;

  /// `parameters`: name and shape of each trainable parameter, in order; `world_size` >= 1.
  /// Throws std::invalid_argument for world_size < 1 or a negative dimension.
  FlatLayout(const std::vector<std::pair<std::string, std::vector<int64_t>>>& parameters,
             int64_t world_size);

  const std::vector<FlatParameter>& parameters() const { return parameters_; }
  int64_t world_size() const { return world_size_; }
  /// Elements of the parameters, without padding.
  int64_t numel() const { return numel_; }
  /// Elements of the buffer with padding: a multiple of world_size x kAlignment.
  int64_t padded_numel() const { return padded_numel_; }
  /// Elements of each rank's slice: padded_numel() / world_size.
  int64_t shard_numel() const { return padded_numel_ / world_size_; }
  /// Rank `rank`'s slice of the flat buffer. Throws std::out_of_range for a rank outside
  /// [0, world_size).
  ElementRange shard(int64_t rank) const;
  /// Columns of the [world_size, shard_numel] view per bucket, a multiple of kAlignment:
  /// world_size x columns fp32 elements take at most kBucketBytes (or one kAlignment).
  int64_t bucket_columns() const;
  /// The parameters' pieces inside `flat` (padding skipped), in buffer order.
  std::vector<FlatPiece> pieces(const ElementRange& flat) const;

 private:
  std::vector<FlatParameter> parameters_;
  int64_t world_size_ = 1;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
};

}  // namespace gpurun

// Datasets: samples that the trainer indexes by a per-epoch permutation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace gpurun {

/// One batch: inputs [B, ...] ready for the model (float32 features, or int64 token ids for
/// sequence models), targets int64 class indices: [B] for one class per sample, or [B, T]
/// for one per position (e.g. the next character of text; see loss.h).
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
};

/// Where a batch's samples stand in their epoch. A data set whose samples are random (an
/// augmentation, a window's offset) draws sample i's randomness from
/// sample_seed(seed, epoch, positions[i]) alone, so that a sample's contents depend on neither
/// the loader's workers, nor timing, nor the world size: a resume at any world size sees the
/// same samples as the uninterrupted run.
struct BatchContext {
  int64_t seed = 0;      ///< train.seed
  int64_t epoch = -1;    ///< the training epoch (0-based); -1: evaluation, which draws nothing
  at::Tensor positions;  ///< int64 [B]: each sample's position in the epoch's permutation
  bool training() const { return epoch >= 0; }
};

/// Random access to N samples.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  /// The samples at `indices` (int64 [B], each in [0, size())), in that order.
  virtual Batch get(const at::Tensor& indices) const = 0;
  /// The samples at `indices` as a training step (context.training()) or evaluation sees
  /// them. The default ignores the context: samples without randomness. May be called from
  /// several loader threads at once: an implementation must be safe for concurrent calls.
  virtual Batch get_batch(const at::Tensor& indices, const BatchContext& context) const {
    (void)context;
    return get(indices);
  }
};

/// A dataset from tensors already in host memory. `inputs` [N, ...] of any dtype is
/// converted per batch by `transform` (e.g. uint8 pixels to normalised float32), which keeps
/// the resident copy small; `targets` [N, ...] int64.
class TensorDataset : public Dataset {
 public:
  using Transform = std::function<at::Tensor(const at::Tensor&)>;
  TensorDataset(at::Tensor inputs, at::Tensor targets, Transform transform = {});
  int64_t size() const override;
  Batch get(const at::Tensor& indices) const override;

 private:
  at::Tensor inputs_, targets_;
  Transform transform_;
};

/// What a dataset factory returns: both splits and the shape information models need.
struct DatasetSplits {
  std::shared_ptr<Dataset> train;
  std::shared_ptr<Dataset> eval;
  std::vector<int64_t> input_shape;  ///< shape of one sample, e.g. {1, 28, 28}; text: {context}
  int64_t num_classes = 0;           ///< classes; for token data the vocabulary size
  /// The text of each class index when it has one, else empty: csv's string labels, or text's
  /// characters (token i decodes to class_names[i], one UTF-8 code point). Saved in every
  /// checkpoint's manifest (extra.class_names) so outputs decode without the data.
  std::vector<std::string> class_names;
};

/// The order of epoch `epoch`'s samples: a permutation of [0, n) drawn from a generator
/// seeded with (seed, epoch) alone, so any epoch's order is reproducible without saved state.
at::Tensor epoch_permutation(int64_t n, int64_t seed, int64_t epoch);

/// The seed of one sample's random draws: a hash of (seed, epoch, position in the epoch), the
/// three BatchContext gives. Seed a private generator with it (at::make_generator), never the
/// global one, which dropout also draws from.
uint64_t sample_seed(int64_t seed, int64_t epoch, int64_t position);

}  // namespace gpurun

// The collectives an optimizer step needs, as an interface: distributed/collectives.h
// implements it over c10d (Gloo, NCCL). The optimizers of this room (step_optimizer.h) call
// it, and so does a memory probe's optimizer, which runs without one (a null pointer: one
// process).
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace gpurun {

class StepCollectives {
 public:
  enum class Op { kSum, kMax };

  virtual ~StepCollectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  /// Sums the gradients of `params` over all ranks into every rank's .grad (DDP's all-reduce,
  /// in buckets), with `control` values summed alongside. See Collectives::sync_gradients.
  virtual void sync_gradients(const std::vector<at::Tensor>& params,
                              std::vector<double>& control) = 0;

  /// `input`: world_size x n contiguous elements on every rank; `output`: n contiguous
  /// elements of the same dtype, which receive the SUM over the ranks of input's block
  /// [rank x n, (rank + 1) x n). Sums, never averages: the caller scales (Gloo's AVG is not
  /// what it says, pytorch #162338).
  virtual void reduce_scatter(const at::Tensor& input, const at::Tensor& output) = 0;

  /// `input`: n contiguous elements; `output`: world_size x n contiguous elements of the same
  /// dtype, which receive every rank's input by rank. `input` must not alias `output`.
  virtual void all_gather(const at::Tensor& input, const at::Tensor& output) = 0;

  /// Reduces `values` element-wise over all ranks (float64) and returns the result.
  virtual std::vector<double> all_reduce(std::vector<double> values, Op op) = 0;
};

}  // namespace gpurun

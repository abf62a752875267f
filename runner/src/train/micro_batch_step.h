// One optimizer step's forward and backward passes, split into micro-batches.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "gpurun/loss.h"

namespace gpurun {

class Dataset;
class SegmentedModel;

/// Accumulates into the parameters' .grad the gradient of the mean `loss` (loss.h) over the
/// step's window of W = `window` samples, of which this rank holds `indices` (int64 [S],
/// S <= W; S = W in a single process), computed in chunks of at most `micro_batch` samples.
/// Each chunk's mean loss is weighted by chunk / W, so the result, summed over the ranks,
/// equals the gradient of one pass over all W samples (up to float summation order),
/// including for a short last window and unequal shards. The caller zeroes gradients first.
/// Returns this rank's share of the window's mean loss: sum of chunk losses x chunk / W.
/// `window` <= 0 means S.
double accumulate_gradients(SegmentedModel& model, const Dataset& data, const at::Tensor& indices,
                            int64_t micro_batch, c10::Device device, int64_t window = 0,
                            const LossFn& loss = cross_entropy);

}  // namespace gpurun

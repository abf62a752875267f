// One optimizer step's forward and backward passes, split into micro-batches.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "gpurun/loss.h"

namespace gpurun {

class Dataset;
class SegmentedModel;

/// Accumulates into the parameters' .grad the gradient of the mean `loss` (loss.h) over
/// the samples `indices` (int64 [W], the step's window on this rank), computed in chunks of
/// at most `micro_batch` samples. Each chunk's mean loss is weighted by chunk / W, so the
/// result equals the gradient of one pass over all W samples (up to float summation order),
/// including for a short last window. The caller zeroes gradients first. Returns the mean
/// loss over the window.
double accumulate_gradients(SegmentedModel& model, const Dataset& data, const at::Tensor& indices,
                            int64_t micro_batch, c10::Device device,
                            const LossFn& loss = cross_entropy);

}  // namespace gpurun

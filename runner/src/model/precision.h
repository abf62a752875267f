// Mixed precision: train.precision resolved on a device, and the autocast of the forward pass
// (AutocastGuard mirrors Python's torch.autocast). fp16's gradient scaler is optim/grad_scaler.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "model/autocast_scope.h"

namespace gpurun {

enum class Precision { kFp32, kBf16, kFp16 };

/// "fp32", "bf16", "fp16".
const char* precision_name(Precision p);

/// The autocast dtype of `p`: kBFloat16, kHalf; kFloat for fp32 (autocast off).
c10::ScalarType autocast_dtype(Precision p);

/// train.precision resolved on `device`, with the reason for `auto`'s choice.
struct ResolvedPrecision {
  Precision precision = Precision::kFp32;
  std::string reason;  ///< e.g. "auto: the CPU has AVX512-BF16" or "train.precision"
};

/// fp32 | bf16 | fp16 as written; auto: bf16 where the device computes it natively (CUDA
/// compute capability >= 8, as torch.cuda.is_bf16_supported(); a CPU with AVX512-BF16 or
/// AMX-BF16), else fp16 with the scaler on CUDA, else fp32 (a CPU without bf16 units gains
/// nothing from a narrower dtype). Throws ConfigError for another word.
ResolvedPrecision resolve_precision(const std::string& setting, c10::Device device);

/// For its lifetime, runs the thread's ops on `device`'s type under autocast to `precision`
/// (nothing for fp32), as `with torch.autocast(device_type, dtype)`: enables autocast and sets
/// its dtype, increments the nesting; on destruction puts both back and, when the outermost
/// guard ends, clears the cache of casted weights. Autocast state is thread-local: a guard
/// covers only the thread that made it. Run the forward pass and the loss under it, the
/// backward pass outside it (PyTorch's recipe).
class AutocastGuard {
 public:
  AutocastGuard(Precision precision, c10::Device device);
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<AutocastScope> scope_;  ///< empty for fp32
};

/// What a training step needs from the precision: the autocast dtype, and the loss scale
/// (undefined: none) the loss is multiplied by before backward.
struct StepPrecision {
  Precision precision = Precision::kFp32;
  at::Tensor loss_scale;
};

}  // namespace gpurun

// Mixed precision: the autocast dtype of the forward pass and, for fp16, the gradient scaler.
//
// LibTorch has autocast but no GradScaler (pytorch/pytorch#44710). AutocastGuard mirrors
// Python's torch.autocast and GradScaler mirrors torch.amp.GradScaler (torch/amp/grad_scaler.py)
// with its defaults and state_dict, on the same two kernels, so that the same gradients give the
// same scale, the same skipped steps and the same parameters as in PyTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json_fwd.hpp>

#include "model/autocast_scope.h"

namespace torch::optim {
class Optimizer;
}

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

/// Dynamic loss scaling for fp16 (Micikevicius et al. 2018, "Mixed Precision Training";
/// PyTorch's torch.amp.GradScaler, whose defaults these are). Per optimizer step:
///   backward of scale(loss) ... unscale(params) ... [clip] ... step(optimizer) ... update()
/// unscale() divides every gradient by the scale and notes whether any is inf or NaN; step()
/// skips the optimizer step when one was; update() halves the scale after such a step
/// (backoff), and doubles it after `growth_interval` clean steps in a row (growth). With
/// gradient accumulation, one unscale, step and update per optimizer step; with DDP, after the
/// gradient all-reduce, where an inf on any rank is an inf in every rank's sum, so every rank
/// skips the same step.
class GradScaler {
 public:
  struct Options {
    double init_scale = 65536.0;  ///< 2^16
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
  };
  /// The scale (float32, 0-d) and growth tracker (int32, 0-d) live on `device`, like the
  /// gradients, so that no step waits for the device except step()'s one read of found_inf.
  GradScaler(c10::Device device, Options options);
  explicit GradScaler(c10::Device device) : GradScaler(device, Options{}) {}

  /// The 0-d float32 scale on the device: the loss is multiplied by it before backward.
  const at::Tensor& scale() const { return scale_; }
  double scale_value() const;

  /// Divides the .grad of each of `params` that has one by the scale, in place, and records
  /// whether any value is inf or NaN (at::_amp_foreach_non_finite_check_and_unscale_). Once per
  /// step: a second call before update() throws std::logic_error, as PyTorch's does.
  void unscale(const std::vector<at::Tensor>& params);
  /// unscale() of the gradient tensors themselves (a sharded optimizer's fp32 slice).
  void unscale_tensors(const std::vector<at::Tensor>& grads);
  /// Whether the last unscale found an inf or NaN (1) or not (0): one read of the device.
  double found_inf() const;
  /// Sets that flag: a sharded step's value agreed by every rank (their maximum).
  void set_found_inf(double value);
  /// Runs optimizer.step() unless unscale() found an inf or NaN (calling unscale() first when
  /// the step has not); returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params);
  /// The new scale after this step (at::_amp_update_scale_); ends the step.
  void update();

  /// PyTorch's GradScaler.state_dict(): scale, growth_factor, backoff_factor,
  /// growth_interval, _growth_tracker.
  nlohmann::json state_dict() const;
  /// Inverse of state_dict(); throws ResumeError on a malformed one.
  void load_state_dict(const nlohmann::json& state);

 private:
  Options options_;
  at::Tensor scale_, growth_tracker_, found_inf_;
  bool unscaled_ = false;
};

/// What a training step needs from the precision: the autocast dtype, and the loss scale
/// (undefined: none) the loss is multiplied by before backward.
struct StepPrecision {
  Precision precision = Precision::kFp32;
  at::Tensor loss_scale;
};

}  // namespace gpurun

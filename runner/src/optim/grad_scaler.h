// Dynamic loss scaling for fp16. LibTorch has autocast but no GradScaler
// (pytorch/pytorch#44710): GradScaler mirrors torch.amp.GradScaler (torch/amp/grad_scaler.py)
// with its defaults and state_dict, on the same two kernels, so that the same gradients give the
// same scale, the same skipped steps and the same parameters as in PyTorch.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json_fwd.hpp>

namespace torch::optim {
class Optimizer;
}

namespace gpurun {

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

}  // namespace gpurun

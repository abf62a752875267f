// One RAII scope of LibTorch's thread-local autocast state, for the three places that set it:
// the training step's forward pass (model/precision.h, AutocastGuard), activation
// checkpointing's recomputation under the forward's state, and LoRA's adapted weights, summed
// in float32 with autocast off.
#pragma once

#include <ATen/autocast_mode.h>

namespace gpurun {

/// For its lifetime, autocast on device type `type` is `enabled`, casting to `dtype`; then both
/// are put back. Nesting is counted as torch.autocast counts it: when the outermost scope
/// ends, the cache of casted weights is cleared. Thread-local, like the state it sets.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType type, bool enabled, c10::ScalarType dtype)
      : type_(type),
        was_enabled_(at::autocast::is_autocast_enabled(type)),
        was_dtype_(at::autocast::get_autocast_dtype(type)) {
    at::autocast::set_autocast_enabled(type_, enabled);
    at::autocast::set_autocast_dtype(type_, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, was_enabled_);
    at::autocast::set_autocast_dtype(type_, was_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType type_;
  bool was_enabled_;
  c10::ScalarType was_dtype_;
};

}  // namespace gpurun

// Saving and restoring LibTorch's global random generators, the one way gpurun does it: the
// global CPU generator drives dropout and every CPU random op, and its state is part of a
// checkpoint; activation checkpointing, the memory probe and epoch hooks must leave the
// stream as they found it, so that a run draws the same numbers with or without them.
#pragma once

#include <cstdint>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace gpurun {

/// The global default generator of `device`: the CPU one for a CPU device, else that of the
/// device (e.g. cuda:0; a CUDA device without an index means the current one).
at::Generator default_generator(const c10::Device& device);

/// A copy of `generator`'s state (a uint8 tensor on the CPU, whatever the device), read under
/// the generator's mutex as ATen's Generator.h asks of every access. `generator` is a handle:
/// a copy refers to the same generator.
at::Tensor rng_state(at::Generator generator);

/// Puts `generator` at `state`, a tensor rng_state() returned for a generator of the same
/// kind, under its mutex. Throws c10::Error for a state of another kind or size.
void set_rng_state(at::Generator generator, const at::Tensor& state);

/// For its lifetime, keeps a copy of a generator's state and puts it back when destroyed, so
/// that whatever draws numbers in between leaves the generator's stream untouched:
///
///   { RngGuard keep(default_generator(at::kCPU)); hook(); }  // the training stream unmoved
///
/// With `start`, the generator also runs from `start` meanwhile (torch.random.fork_rng with a
/// set state: activation checkpointing recomputes a segment from the forward pass's state).
class RngGuard {
 public:
  explicit RngGuard(at::Generator generator);
  RngGuard(at::Generator generator, const at::Tensor& start);
  ~RngGuard();
  RngGuard(const RngGuard&) = delete;
  RngGuard& operator=(const RngGuard&) = delete;

  /// Bytes of the state copy this guard holds (for memory accounting).
  int64_t saved_bytes() const { return static_cast<int64_t>(saved_.nbytes()); }

 private:
  at::Generator generator_;
  at::Tensor saved_;
};

}  // namespace gpurun

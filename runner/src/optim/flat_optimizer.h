// The sharded optimizer: ZeRO stages 1 and 2 (Rajbhandari et al. 2020, "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models"), in the layout of Megatron-core's
// distributed optimizer (one flat buffer of parameters and one of gradients, each rank owning
// a contiguous slice; megatron/core/optimizer/distrib_optimizer.py), with fp32 master weights
// for 16-bit models and the ZeRO-Offload placement of the state in host memory (Ren et al.
// 2021).
//
// The model's trainable parameters become views into one flat parameter buffer, and their
// .grad views into one flat gradient buffer, both of flat_layout.h's layout. A step:
//  1. the backward passes accumulate into the gradient buffer (all micro-batches of the step:
//     a local full accumulation, so the traffic is one reduce-scatter per optimizer step,
//     not one per micro-batch as in DeepSpeed's stage 2);
//  2. reduce_gradients(): reduce-scatter (SUM) into this rank's fp32 gradient slice, in
//     buckets of at most 25 MiB of fp32 when the gradients are 16-bit (summed in fp32);
//     mode "gradients" then releases the full gradient buffer until the next step;
//  3. the update of this rank's slice by ATen's fused kernels (_fused_adam_, _fused_adamw_,
//     _fused_sgd_), torch.optim's update rules (fused=True), on the master slice (fp32) or,
//     without one, on the slice of the fp32 parameter buffer in place;
//  4. the master slice cast into the parameter buffer, and one all-gather of the parameter
//     buffer's slices into every rank's buffer.
// Bytes moved per step and rank (ring algorithms): reduce-scatter (N-1)/N x 4P plus
// all-gather (N-1)/N x wP, w the weights' bytes, against DDP's all-reduce 2 (N-1)/N x 4P:
// equal for fp32 weights, 3/4 of it for 16-bit ones.
//
// Memory of rank r of N, P the padded parameter count, S = P / N, w the weights' bytes:
//   parameter buffer wP; gradient buffer wP (mode gradients: not during the update);
//   Adam's moments 8S (SGD with momentum 4S); master slice 4S (with master weights or
//   offload); from the reduce-scatter to the all-gather only (not during the backward passes):
//   the fp32 gradient slice 4S (one process with fp32 gradients: the gradient buffer itself) and
//   the all-gather's input, a bucket of this rank's weights; offload moves the moments, the master
//   and a gradient copy (4S) to host memory, pinned on CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "gpurun/config.h"
#include "optim/flat_layout.h"
#include "optim/step_optimizer.h"

namespace gpurun {

struct FlatOptimizerOptions {
  /// Release the full gradient buffer once reduced (distributed.shard: gradients).
  bool release_gradients = false;
  /// Hold the parameters in `half` (bf16 or fp16) and keep an fp32 master slice.
  bool master_weights = false;
  c10::ScalarType half = c10::ScalarType::BFloat16;
  /// State, master slice and update in host memory (pinned when the parameters are on CUDA).
  bool offload = false;
};

class FlatOptimizer final : public StepOptimizer {
 public:
  /// Takes over `params` (name, parameter; one dtype and device): their storage moves into
  /// the flat parameter buffer (cast to `half` with master weights), their .grad into the
  /// gradient buffer. With master weights the parameters are fp32 or already `half` (a run
  /// holds its model in 16 bits: train/run_setup.h), and the master slice starts from the
  /// 16-bit values, as Megatron-core's optimizer copies its main parameters from the model's
  /// bf16 ones. `comm` nullptr: one process, or a memory probe acting as rank `rank` of
  /// `world_size` without collectives (reduce-scatter and all-gather copy its own slice).
  /// Throws ConfigError for parameters of mixed dtypes or devices, or master weights over
  /// parameters neither fp32 nor `half`.
  FlatOptimizer(const OptimConfig& optim, FlatOptimizerOptions options,
                const std::vector<std::pair<std::string, at::Tensor>>& params,
                StepCollectives* comm, int64_t rank = 0, int64_t world_size = 1);

  void zero_grad() override;
  void release_gradients() override;
  void reduce_gradients(std::vector<double>& control) override;
  void unscale(GradScaler& scaler) override;
  /// The global norm from each rank's sum of squares of its slice, gathered and added in rank
  /// order in float64, so that every rank computes the same value; it equals the norm of the
  /// whole gradient up to float rounding (the unsharded path adds per-tensor norms). The sum of
  /// squares is taken in float64 in chunks of FlatLayout::kClipChunkElements, added in order:
  /// its only temporary is one chunk's float64 copy (32 MiB at most).
  double clip_grad_norm(double max_norm) override;
  bool step(double lr, GradScaler* scaler) override;
  FlatOptimizer* flat() override { return this; }

  const FlatLayout& layout() const { return layout_; }
  int64_t rank() const { return rank_; }
  /// This rank's slice of the flat buffer.
  ElementRange shard() const { return layout_.shard(rank_); }

  /// The state this rank owns, by name, each a flat fp32 tensor of shard().size() elements
  /// (on the host with offload): "exp_avg", "exp_avg_sq" (adam, adamw), "momentum_buffer"
  /// (sgd with momentum), "master" (with master weights or offload). Live tensors: a restore
  /// copies into them.
  std::vector<std::pair<std::string, at::Tensor>> state();
  /// Optimizer steps taken (Adam's bias correction; SGD's first step).
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t steps);
  /// Copies the master slice from the parameter buffer (after the model's weights were
  /// loaded from a checkpoint without a master slice, or broadcast from rank 0).
  void reload_master_from_parameters();
  /// The flat parameter buffer (padded_numel() elements, the weights' dtype).
  const at::Tensor& parameter_buffer() const { return params_; }
  /// Bytes of optimizer state this rank holds (moments, momentum, master), wherever they live.
  int64_t state_bytes() const;

 private:
  void ensure_gradient_buffer();
  /// The gradient buffer and the parameters' .grad views (not the reduced slice).
  void release_full_gradients();
  at::Tensor weights_slice() const;

  OptimConfig optim_;
  FlatOptimizerOptions options_;
  StepCollectives* comm_;
  int64_t rank_ = 0;
  FlatLayout layout_;
  std::vector<at::Tensor> views_;                        // the parameters, in layout order
  at::Tensor params_, grads_;                            // flat buffers [P]
  at::Tensor grad_slice_;                                // fp32 [S] on the device
  at::Tensor host_grad_;                                 // fp32 [S] on the host (offload)
  at::Tensor master_, exp_avg_, exp_avg_sq_, momentum_;  // fp32 [S], state device
  at::Tensor step_tensor_;  // fused kernels' step (float32, 0-d... [1])
  int64_t step_count_ = 0;
};

}  // namespace gpurun

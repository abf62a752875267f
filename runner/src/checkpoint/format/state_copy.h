// The two halves of a checkpoint save. On the training thread, copy(): every tensor of the
// state (the model's state_dict, the optimizer's per-parameter state, the random generators) is
// copied into host buffers, and nothing else is done: that copy is the training stall. On the
// writer thread, build(): the model digest, the pickled model.pt and trainer.pt, and the
// optimizer's archive (optim.pt), from those buffers alone, so that training may change the
// live state meanwhile (docs/architecture.md, "Checkpoint saves").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Event.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "checkpoint/format/checkpoint_types.h"
#include "checkpoint/format/train_state.h"  // NamedTensors

namespace gpurun {

class HostStateCopy {
 public:
  HostStateCopy();
  ~HostStateCopy();
  HostStateCopy(const HostStateCopy&) = delete;
  HostStateCopy& operator=(const HostStateCopy&) = delete;

  /// Copies `model`'s state_dict, `optimizer`'s state and `rng_states` (already host tensors:
  /// process_rng_states() and the other ranks' ones, named as in trainer.pt) into host buffers.
  /// Buffers for a device's tensors are pinned and reused from save to save; the copies are
  /// queued on the device's current stream, so training goes on at once and its next kernels
  /// run after them (build() waits for them). CPU tensors are copied into buffers that build()
  /// releases unless keep_buffers(true): host memory is the CPU run's device memory, and the
  /// plan decides whether they fit between saves (MeasuredPeaks::checkpoint_buffers). Must not
  /// be called while a build() of the previous copy is running.
  /// Throws ConfigError for an optimizer other than SGD, Adam and AdamW.
  void copy(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
            NamedTensors rng_states);

  /// copy() of a sharded run: the model and `rng_states` only, whose build() writes no
  /// optim.pt (every rank writes its optimizer state as a shard file: shard_files.h).
  void copy(const torch::nn::Module& model, NamedTensors rng_states);

  /// Fills meta.model_digest, meta.threads and meta.cpu_capability of `snapshot` from the last
  /// copy(), and its streamed files (model.pt, optim.pt unless a sharded copy, trainer.pt):
  /// sources that serialize each file as the store writes it, every tensor's bytes straight
  /// from its host buffer (no image of a file in memory). The sources share the buffers: the
  /// next copy() must wait until the snapshot is written and destroyed (a reused buffer would
  /// change under a write). Any thread.
  void build(CheckpointSnapshot& snapshot);

  /// Whether a CPU run's buffers stay from save to save (a save into memory that is already
  /// there stalls training for a warm copy only); false (the default) releases them after
  /// each build(), and at once. Must not be called while a build() is running.
  void keep_buffers(bool keep);

  /// Bytes of tensor data the last copy() copied.
  int64_t copied_bytes() const { return copied_bytes_; }

  /// The optimizer's copy (state_copy.cpp): public so that its helpers there can name it.
  struct OptimizerCopy;

 private:
  void release();  ///< frees the buffers
  /// copy()'s halves: the weights (returns the device of the first one not on the CPU), then
  /// the generators and the event the build waits for, after every other copy is queued.
  std::optional<c10::Device> copy_model(const torch::nn::Module& model);
  void finish_copy(std::optional<c10::Device> device, NamedTensors rng_states);

  NamedTensors weights_;  ///< state_dict order
  NamedTensors rng_;
  std::unique_ptr<OptimizerCopy> optimizer_;
  std::unique_ptr<c10::Event> copied_;  ///< recorded after a device's copies; null on the CPU
  bool on_device_ = false;
  bool keep_ = false;  ///< keep_buffers()
  int threads_ = 0;    ///< at::get_num_threads() of the training thread at copy()
  int64_t copied_bytes_ = 0;
};

}  // namespace gpurun

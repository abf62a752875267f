// `gpurun export` of a checkpoint's weights as a full fp32 state_dict, streamed one tensor at a
// time (docs/architecture.md, "Checkpoint directory"): never the whole model in memory, and never
// the optimizer state gathered.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/format/checkpoint_types.h"

namespace gpurun {

/// Writes `checkpoint`'s weights to `to` (replaced atomically: a temporary file beside it,
/// fsynced, renamed) in torch.save's format, a plain name -> tensor dict in model.pt's order that
/// torch.load reads with weights_only=True: each trainable parameter from the fp32 master
/// weights of the shard files when the checkpoint has them (sharded with optim.master_weights),
/// every other tensor from model.pt, floating-point ones as fp32. model.pt is read record by
/// record and checked against the manifest's model_digest as it is read.
/// Memory: the largest tensor in fp32 (a 16-bit tensor of model.pt that is not a trainable
/// parameter: its record too) plus 8 MiB buffers. The checkpoint must have been verified (its
/// checksums: the view's inspect(verify)); throws DamagedCheckpointError when model.pt does not
/// match model_digest or does not parse, IoError when a file cannot be read or `to` written.
void export_fp32_state_dict(const LoadedCheckpoint& checkpoint, const std::string& to);

/// A checkpoint's weights, read one tensor at a time: the tensors of model.pt in its order,
/// each trainable parameter from the fp32 master weights of the shard files when the
/// checkpoint has them (sharded with optim.master_weights). What every export streams from.
class CheckpointWeights {
 public:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    c10::ScalarType dtype;  ///< of read(): fp32 from a master, else model.pt's
  };
  /// Decodes model.pt's pickle (not its data) and opens the shard index. Throws
  /// DamagedCheckpointError when model.pt does not parse, IoError when it cannot be opened.
  explicit CheckpointWeights(const LoadedCheckpoint& checkpoint);
  ~CheckpointWeights();
  CheckpointWeights(const CheckpointWeights&) = delete;
  CheckpointWeights& operator=(const CheckpointWeights&) = delete;

  const std::vector<Tensor>& tensors() const { return tensors_; }
  /// The index of `name` in tensors(), or -1.
  int64_t find(const std::string& name) const;
  /// The values of tensors()[i], a CPU tensor of its shape and dtype.
  at::Tensor read(size_t i);
  /// Reads model.pt's records in order (8 MiB at a time) and compares their xxh3 with the
  /// manifest's model_digest; throws DamagedCheckpointError when they differ.
  void verify();

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::vector<Tensor> tensors_;
};

}  // namespace gpurun

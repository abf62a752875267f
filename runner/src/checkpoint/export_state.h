// `gpurun export` of a checkpoint's weights as a full fp32 state_dict, streamed one tensor at a
// time (docs/architecture.md, "Checkpoint directory"): never the whole model in memory, and never
// the optimizer state gathered.
#pragma once

#include <string>

#include "checkpoint/store.h"

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

}  // namespace gpurun

// Capture and restore of a run whose optimizer is a StepOptimizer (optim/step_optimizer.h),
// replicated or sharded, from and into unsharded (optim.pt) and sharded (shard files)
// checkpoints alike (docs/architecture.md, "Checkpoint loads"):
//
//   live optimizer      checkpoint   what a restore does
//   replicated          optim.pt     train_state.h's restore_state(), unchanged
//   flat (any world)    sharded      each rank reads the elements of its slice from whichever
//                                    shard files hold them (ShardReader: resharding)
//   flat                optim.pt     each rank slices LibTorch's per-parameter state into its
//                                    flat state (an unsharded run resumes sharded)
//   replicated          sharded      each parameter's state is assembled from the chunks into
//                                    LibTorch's optimizer (a sharded run resumes at world 1)
//
// Never is the whole state consolidated on one rank: a flat rank reads its slice only.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/nn/module.h>

#include "checkpoint/format/train_state.h"

namespace gpurun {

class StepOptimizer;

/// Whether the checkpoint's optimizer state is in shard files (its manifest has a
/// sharded_optimizer member).
bool is_sharded(const LoadedCheckpoint& checkpoint);

/// capture_state() of a StepOptimizer, in one call on this thread: a replicated one as
/// train_state.h's; a flat one gives model.pt, trainer.pt and this rank's shard file (in memory:
/// the memory probe's checkpoint), with meta.sharded_optimizer set. `meta.config`'s optim.name
/// is recorded in the index.
CheckpointSnapshot capture_state(const torch::nn::Module& model, StepOptimizer& optimizer,
                                 CheckpointMeta meta,
                                 const std::vector<NamedTensors>& rank_rng_states = {},
                                 int64_t* copied_bytes = nullptr);

/// restore_state() into a StepOptimizer, as the table at the top of this file says: `model`'s
/// weights from model.pt (and, for a replicated optimizer from a checkpoint with fp32 master
/// weights, its trainable parameters from those), the optimizer's state and step count, and
/// rank `rank`'s generators. Everything is read, checked and decoded before anything changes;
/// the state is read to host memory first, then moved. Throws as train_state.h's
/// restore_state(): DamagedCheckpointError (a shard file not what the manifest says, chunks that
/// do not hold a range), IoError, and ResumeError (a parameter missing or of another shape, a
/// state the checkpoint lacks).
bool restore_state(const LoadedCheckpoint& checkpoint, torch::nn::Module& model,
                   StepOptimizer& optimizer, int rank = 0);

}  // namespace gpurun

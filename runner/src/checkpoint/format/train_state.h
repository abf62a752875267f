// Capture and restore of everything a resume needs, as checkpoint files:
//   model.pt    the state_dict as a pickled name -> tensor dict (torch.load gives a plain dict)
//   optim.pt    the optimizer's state (LibTorch's serialize archive)
//   trainer.pt  the global CPU generator's state (drives dropout), as a pickled dict
// Data order needs no state: epoch_permutation() is a function of (seed, epoch), and the
// position in the epoch is in the manifest. The LR schedule is a function of global_step.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>

#include "checkpoint/format/checkpoint_types.h"
#include "checkpoint/format/pickle.h"  // NamedTensors, pickle_tensors(), unpickle_tensors()

namespace gpurun {

/// The device `model`'s parameters live on; the CPU for a model without parameters.
c10::Device model_device(const torch::nn::Module& model);

/// This process's random state for a model on `device`: "cpu_rng_state" (the global CPU
/// generator, dropout on the CPU and every CPU random op) and, on a CUDA device,
/// "cuda_rng_state" (that device's default generator: dropout on the GPU).
NamedTensors process_rng_states(const c10::Device& device);

/// What trainer.pt holds: process_rng_states() of `model`'s device and, in a distributed run,
/// `rank_rng_states`, the other ranks' process_rng_states() (rank 1, 2, ...), as
/// "<name>.rank<R>".
NamedTensors trainer_rng_states(const torch::nn::Module& model,
                                const std::vector<NamedTensors>& rank_rng_states = {});

/// A checkpoint of `model`, `optimizer` and trainer_rng_states() in one call on this thread
/// (HostStateCopy's copy() then build()); `meta` gets the model digest, thread count and CPU
/// capability filled in; `copied_bytes`, when given, the bytes of tensor data copied. Its files
/// are bytes in memory (CheckpointSnapshot::materialize(): nothing is left streamed). The
/// memory probe and tests take it; the trainer's saves split it and stream the files.
CheckpointSnapshot capture_state(const torch::nn::Module& model,
                                 const torch::optim::Optimizer& optimizer, CheckpointMeta meta,
                                 const std::vector<NamedTensors>& rank_rng_states = {},
                                 int64_t* copied_bytes = nullptr);

/// Loads a checkpoint (CheckpointStore's choice, its sizes checked) into `model` (parameters and
/// buffers copied in place, so the optimizer's references stay valid), `optimizer` and rank
/// `rank`'s generators (the CPU one, and the model's CUDA device's when the checkpoint has its
/// state). Its files are read once, straight into the tensors' storage, and checked against the
/// manifest as they are read; all three are read and decoded before anything changes. Returns false
/// when the checkpoint has no CPU generator state for `rank` (it was written by fewer ranks); the
/// generators are then left as they are.
/// Throws DamagedCheckpointError when a file is not what the manifest says or does not decode
/// (the resume then falls back to the previous checkpoint), IoError when a file cannot be
/// opened or read (the storage failed: exit 1, and a restart reads the same checkpoint again),
/// and ResumeError when a tensor is missing or has another shape (the model is not the
/// checkpoint's), naming it; the model, optimizer and generators are then unchanged.
bool restore_state(const LoadedCheckpoint& checkpoint, torch::nn::Module& model,
                   torch::optim::Optimizer& optimizer, int rank = 0);

/// The model's tensors of a checkpoint (model.pt, read and checked as restore_state() reads
/// it). Throws DamagedCheckpointError and IoError as restore_state() does.
NamedTensors load_model_tensors(const LoadedCheckpoint& checkpoint);

/// The tensors of the checkpoint's pickled file `name` (model.pt, trainer.pt), read and checked
/// as restore_state() reads it. Throws DamagedCheckpointError and IoError as restore_state() does.
NamedTensors load_checkpoint_tensors(const LoadedCheckpoint& checkpoint, const std::string& name);

/// The parts of restore_state() that a sharded restore (sharded_state.h) shares with it:
/// check_weights() throws ResumeError when `saved` (model.pt of the checkpoint at `where`) lacks
/// a tensor of `model`'s state_dict or holds it in another shape; copy_weights() then copies
/// them in place; restore_generators() sets rank `rank`'s generators from trainer.pt's tensors
/// and returns whether the CPU one was there.
/// load_optimizer_archive() reads optim.pt into `archive` (tensors on the host), checked as it
/// is read; throws DamagedCheckpointError and IoError as restore_state() does.
void load_optimizer_archive(const LoadedCheckpoint& checkpoint,
                            torch::serialize::InputArchive& archive);
void check_weights(const NamedTensors& saved, const torch::nn::Module& model,
                   const std::string& where);
void copy_weights(const NamedTensors& saved, torch::nn::Module& model);
bool restore_generators(const NamedTensors& generators, const torch::nn::Module& model, int rank);

/// LibTorch's CPU vector capability in use ("AVX2", "AVX512", "DEFAULT", ...).
std::string cpu_capability();

}  // namespace gpurun

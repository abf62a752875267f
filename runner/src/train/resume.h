// Where a run starts its weights: a fresh run from model.init_from (init_weights.h), a resumed
// one from a checkpoint, which must have been written under the same training keys; and what a
// resume does not carry over bit for bit, said once in the log.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "checkpoint/format/checkpoint_types.h"
#include "data/data_fingerprint.h"
#include "gpurun/config.h"
#include "model/precision.h"

namespace torch::nn {
class Module;
}

namespace gpurun {

/// Optimizer steps in an epoch of `train_samples` samples: ceil(samples / train.batch_size), the
/// global batch every memory plan keeps.
int64_t steps_per_epoch(const RunConfig& config, int64_t train_samples);

/// Throws ResumeError, naming each changed key, when `loaded` was written under other training
/// keys than `config` (config_hash). Extending train.epochs is allowed, and a checkpoint of
/// train.precision auto resumes under any precision (gpurun chose it). The checkpoint's config
/// is read back through config_from_json, so that a key added by a later gpurun (taking its
/// default) does not make an older checkpoint look like another run.
/// Throws ResumeError as well when train.epochs leaves the run fewer optimizer steps (epochs x
/// `steps_per_epoch`) than the checkpoint has done, naming the key, the checkpoint's step, the
/// new total and the fewest epochs that continue it. A total equal to the checkpoint's step (an
/// end-of-epoch checkpoint of the last epoch) is accepted: the run has nothing left to train and
/// finishes at once, its final checkpoint being that one. And check_hf_config().
void check_resumable(const RunConfig& config, const LoadedCheckpoint& loaded,
                     int64_t steps_per_epoch);

/// model.name hf: throws ResumeError (exit 3) when the folder's config.json differs from the
/// one the checkpoint's run started from (kept in extra.init_from) in a key that builds the model,
/// naming each key with both values. The folder may have moved (model.path is not a training
/// key); its weights are not read, but its config.json must be there: the model is built from
/// it before a checkpoint is chosen.
void check_hf_config(const RunConfig& config, const LoadedCheckpoint& loaded);

/// Compares the data of this run (`now`) with the fingerprint `loaded` recorded
/// (data/data_fingerprint.h). Throws ResumeError naming each change (a file added, removed or of
/// another size; another sample count) unless `allow` (--allow-data-change); then, and for files
/// whose mtime alone is newer, a warning. Returns the changes allowed as an event's fields
/// ({path, changes}), null when none. A checkpoint without a fingerprint (an older gpurun's) is
/// not compared.
nlohmann::json check_data(const LoadedCheckpoint& loaded, const DataFingerprint& now, bool allow);

/// model.init_from into `model` of a fresh run, logged with what strict false left out; returns
/// InitialWeights::to_json() for the manifests. Throws as load_initial_weights().
nlohmann::json load_init_from(torch::nn::Module& model, const RunConfig& config);

/// model.name hf: the folder's weights into `model` of a fresh run (train/hf_weights.h), logged;
/// returns load_hf_weights()'s record with "kind": "hf" and the folder's config.json ("config"),
/// which the manifest keeps for `gpurun export --format hf`.
nlohmann::json load_hf_model(torch::nn::Module& model, const RunConfig& config);

/// This process, as a resume compares it with the run that wrote the checkpoint.
struct ResumingProcess {
  ResolvedPrecision precision;  ///< train.precision as resolved here
  nlohmann::json model_source;  ///< describe_model_source() of this run
  int rank = 0;
  int world_size = 1;
  bool rng_restored = true;     ///< the checkpoint held this rank's random state
  int64_t steps_per_epoch = 0;  ///< steps_per_epoch() of this run; 0: unknown
};

/// Logs what resuming `loaded` in `process` changes against the run that wrote it: another
/// thread count or CPU capability (the last bits differ), no random state for this rank,
/// another model file, another precision, another world size, an unread model.init_from, and
/// another train.epochs: the old and the new total of optimizer steps, with a warning when the
/// learning-rate schedule (cosine) spreads over the total, so that its curve changes from the
/// checkpoint's step on. Warnings that concern every rank alike are logged by rank 0 only.
void log_resume_differences(const LoadedCheckpoint& loaded, const RunConfig& config,
                            const ResumingProcess& process);

}  // namespace gpurun

// Where a run starts its weights: a fresh run from model.init_from (init_weights.h), a resumed
// one from a checkpoint, which must have been written under the same training keys; and what a
// resume does not carry over bit for bit, said once in the log.
#pragma once

#include <nlohmann/json.hpp>

#include "checkpoint/store.h"
#include "gpurun/config.h"
#include "train/precision.h"

namespace torch::nn {
class Module;
}

namespace gpurun {

/// Throws ResumeError, naming each changed key, when `loaded` was written under other training
/// keys than `config` (config_hash). Extending train.epochs is allowed, and a checkpoint of
/// train.precision auto resumes under any precision (gpurun chose it). The checkpoint's config
/// is read back through config_from_json, so that a key added by a later gpurun (taking its
/// default) does not make an older checkpoint look like another run.
void check_resumable(const RunConfig& config, const LoadedCheckpoint& loaded);

/// model.init_from into `model` of a fresh run, logged with what strict false left out; returns
/// InitialWeights::to_json() for the manifests. Throws as load_initial_weights().
nlohmann::json load_init_from(torch::nn::Module& model, const RunConfig& config);

/// This process, as a resume compares it with the run that wrote the checkpoint.
struct ResumingProcess {
  ResolvedPrecision precision;  ///< train.precision as resolved here
  nlohmann::json model_source;  ///< describe_model_source() of this run
  int rank = 0;
  int world_size = 1;
  bool rng_restored = true;  ///< the checkpoint held this rank's random state
};

/// Logs what resuming `loaded` in `process` changes against the run that wrote it: another
/// thread count or CPU capability (the last bits differ), no random state for this rank,
/// another model file, another precision, another world size, an unread model.init_from.
/// Warnings that concern every rank alike are logged by rank 0 only.
void log_resume_differences(const LoadedCheckpoint& loaded, const RunConfig& config,
                            const ResumingProcess& process);

}  // namespace gpurun

// What `gpurun run` and `gpurun plan` both set up: the device, the data, a memory meter and
// the model; and the memory plan made from them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "gpurun/config.h"
#include "gpurun/dataset.h"
#include "gpurun/errors.h"
#include "gpurun/loss.h"
#include "memory/peak_probe.h"
#include "memory/placement.h"
#include "memory/planner.h"
#include "model/precision.h"

namespace gpurun {

class Collectives;
class MemoryMeter;
class Registry;
class SegmentedModel;

struct Session {
  c10::Device device{c10::kCPU};
  DatasetSplits data;
  std::unique_ptr<MemoryMeter> meter;  ///< installed before the model, so its tensors count
  std::shared_ptr<SegmentedModel> model;
  LossFn loss;  ///< train.loss from the registry
  /// data.stage_dir: a StageResult::to_json() per staged path (data_stage.h); empty: none.
  nlohmann::json data_stage = nlohmann::json::array();
  /// train.precision resolved on the device (`auto`'s choice and why).
  ResolvedPrecision precision;
  /// model.lora: the Linear layers given adapters; empty: none.
  std::vector<std::string> lora_layers;
  /// The process's resident set (VmRSS) when open_session() began, before the data and the
  /// model: the baseline a model's loading is measured against (the `weights` event).
  int64_t resident_before_model_bytes = 0;
};

/// The capacity limit in bytes: `memory_limit` (from --memory-limit) when > 0, else
/// memory.capacity when it is a SIZE, else 0 (the device's own size).
int64_t memory_limit_bytes(const RunConfig& config, int64_t memory_limit);

/// How the ranks of a distributed run agree while planning; empty functions: one process.
struct PlanAgreement {
  /// The worst of every rank's probe of the same configuration: the largest peak, an
  /// out-of-memory error on any rank, the slowest step.
  std::function<Probe(const Probe&)> probe;
  /// True when any rank passes true.
  std::function<bool(bool)> any;
};

/// The agreement over `comm`'s process group, by all-reduces of the probe's peak, out-of-memory
/// flag and step time (each rank's worst); null `comm`: one process, no agreement.
PlanAgreement plan_agreement(Collectives* comm);

/// What building a model WithoutWeights (model/without_weights.h) tells, learned in a child
/// process: in LibTorch 2.11 the meta backend's dispatch, once used, stays in the process (a
/// relu after the scope still dispatches to meta), so nothing may run after it there.
struct ModelShape {
  int64_t weight_bytes = 0;            ///< parameters and buffers
  bool describes_activations = false;  ///< SegmentedModel::activation_estimate() is set
  bool has_segments = false;           ///< activation checkpointing can apply
  /// The estimate (memory/peak_probe.h) of a step of micro-batch 1 on the target device under
  /// the run's precision, without and with activation checkpointing. Its activations are known
  /// only when describes_activations (other models' layers are walked with real weights);
  /// otherwise they are 0 and the estimate is the state alone, a lower bound.
  Estimate one_sample, one_sample_checkpointed;
  StateShape state;  ///< the parameters' shapes, for the per-rank estimate of each placement
  /// The same with LoRA adapters of `lora_rank` on every Linear layer and nothing else
  /// trained, for `gpurun plan` to suggest; none when the run has adapters already, the model
  /// has no segments or no Linear layer.
  std::optional<StateShape> lora_state;
  std::string error;  ///< the factory failed without weights; "" otherwise
};
/// Builds `config`'s model WithoutWeights in a child process and estimates it for `target` and
/// `precision` (the run's device and resolved train.precision). Never throws for the model: a
/// factory that fails without weights is reported in `error`; throws std::runtime_error when no
/// child can be forked.
ModelShape probe_model_shape(const RunConfig& config, const Registry& registry,
                             const DatasetSplits& data, c10::Device target, Precision precision,
                             int64_t lora_rank = 16);

/// The smallest step a plan can choose, by the estimate: micro-batch 1, with activation
/// checkpointing when the model has segments and memory.strategy allows it.
Estimate smallest_step(const RunConfig& config, const ModelShape& shape);

/// open_session()'s ConfigError when the run cannot fit the device: the model's weights alone
/// exceed it (WeightsDoNotFit, found by copying them under the meter), or, before any weight is
/// built, the smallest step by the estimate does (RunDoesNotFit).
struct WeightsDoNotFit : ConfigError {
  using ConfigError::ConfigError;
};
struct RunDoesNotFit : ConfigError {
  using ConfigError::ConfigError;
};

/// Sets the thread count and seed, stages the data files (data.stage_dir), loads the data (not
/// metered: host-resident data sets are not device memory), estimates the model built without its
/// weights (`shape` when the caller has it, else probe_model_shape()) and refuses a run whose
/// smallest step exceeds the capacity by the estimate (RunDoesNotFit: nothing is built or run, so
/// no probe can exhaust the machine), installs the meter, builds the model on the device with its
/// LoRA adapters (model.lora) and frozen parameters (model.freeze), resolves train.precision,
/// looks up the loss. With master weights (uses_master_weights()) the model is held in 16 bits,
/// parameters and floating-point buffers alike (held_dtype()). Throws ConfigError for a bad
/// device, dataset, model, loss, LoRA target or freeze pattern. model.init_from is not read here:
/// only a fresh run loads it (the trainer, after choosing no checkpoint; init_weights.h). The
/// refusal by the estimate is of the smallest step under the placement chosen for `world_size`
/// ranks (placement_world_size(): 0 reads WORLD_SIZE), so that a run that fits only sharded is not
/// refused; an offload the host cannot hold is a ConfigError (exit 2).
Session open_session(const RunConfig& config, const std::string& device, int64_t memory_limit,
                     const Registry& registry, int local_rank = 0,
                     const ModelShape* shape = nullptr, int64_t world_size = 0);

/// The run's data config: resolved_data() (paths beside run.yaml), with a Hugging Face model's
/// vocab_size (model.name hf, config.json) for tokens data that names none.
DataConfig run_data(const RunConfig& config, bool log);

/// This machine's memory in bytes.
int64_t physical_memory_bytes();

/// A session for the estimate only (`gpurun plan --estimate-only`, or a model too large for
/// this machine): the data and the model with its adapters and frozen parameters, built
/// WithoutWeights (model/without_weights.h) on the CPU, whatever `device`; `device` only
/// resolves train.precision. No meter. Nothing may run in the process after it but reading
/// shapes. A model without its own activation_estimate() is built with its weights instead
/// (the estimate runs its layers once), when they fit in a quarter of the machine's memory. Throws
/// ConfigError for a TorchScript model, for a model whose factory cannot run without weights, and
/// for one too large to walk without a description. `data` is the run's data (config.data,
/// unstaged) and `shape` what probe_model_shape() learned of the model for it.
Session open_estimate_session(const RunConfig& config, const std::string& device,
                              const Registry& registry, DatasetSplits data,
                              const ModelShape& shape);

/// The request for the planner from the config: global batch, configured micro-batch,
/// capacity, headroom and strategy.
PlanRequest plan_request(const RunConfig& config, const Session& session, int64_t world_size);

/// Probes and chooses the plan (memory/planner.h: training steps, evaluation, checkpoint
/// capture and resume loading, the largest being measured_peak_bytes), fills in the analytic
/// estimate. A training step whose estimate exceeds the usable capacity (exceeds_by_estimate)
/// is not run: the planner gets it as an estimated probe, which never fits. Each probe is logged
/// as it starts and ends (the probes of a large model take minutes). Fills in the analytic
/// estimate, and turns
/// activation checkpointing on in the model when the plan says so. When `saved` (the plan of
/// the checkpoint being resumed) was made for the same capacity and global batch it is reused
/// without probing, so that a resumed run stays deterministic. With several ranks, `agree`
/// makes every rank choose the same plan: the plan is reused only when every rank can, and
/// each probe counts as the worst rank's.
MemoryPlan make_plan(const RunConfig& config, Session& session, int64_t world_size,
                     const std::optional<MemoryPlan>& saved, const PlanAgreement& agree = {});

/// The analytic estimate of a training step of `micro_batch` samples on this session's model.
Estimate estimate_at(const RunConfig& config, Session& session, int64_t micro_batch,
                     bool checkpointing);

/// The analytic estimate for `plan` on this session's model.
Estimate estimate_for(const RunConfig& config, Session& session, const MemoryPlan& plan);

/// Logs the plan as a run starts it: the precision and the parameters trained, the micro-batch,
/// accumulation and global batch, and the measured peak (each part) against the estimate of a
/// training step and the capacity.
void log_plan(const RunConfig& config, const Session& session, const MemoryPlan& plan);

}  // namespace gpurun

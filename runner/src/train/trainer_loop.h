// The training loop's state and steps, private to train/. trainer.cpp runs it: the start or
// resume, the epochs and the saves; trainer_stop.cpp is the stop at a step boundary (a signal
// or a preemption notice); trainer_step.cpp is one optimizer step (with its fallback after out
// of memory), the loader that feeds it, and evaluation.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpointer.h"
#include "data/loader.h"
#include "distributed/collectives.h"
#include "gpurun/config.h"
#include "gpurun/registry.h"
#include "memory/peak_parts.h"
#include "memory/planner.h"
#include "model/precision.h"
#include "optim/grad_scaler.h"
#include "optim/step_optimizer.h"
#include "report/reporter.h"
#include "train/cost_ledger.h"
#include "train/early_stop.h"
#include "train/immediate_stop.h"
#include "train/resume_check.h"
#include "train/run_setup.h"
#include "train/sample_trace.h"
#include "train/step_metrics.h"
#include "train/trainer.h"
#include "util/signals.h"

namespace gpurun::detail {

class Trainer {
 public:
  Trainer(const RunConfig& config, const RunOptions& options, const Registry& registry,
          std::unique_ptr<Collectives> comm)
      : config_(config),
        options_(options),
        registry_(registry),
        comm_(std::move(comm)),
        rank_(comm_ ? comm_->rank() : 0),
        world_(comm_ ? comm_->world_size() : 1),
        session_(open_session(config, options.device, options.memory_limit, registry,
                              options.dist ? options.dist->local_rank : 0)),
        device_(session_.device),
        data_(session_.data),
        model_(session_.model),
        reporter_(run_dir_or_default(options), rank_ == 0, rank_),
        checkpointer_(config, {options.ckpt_dir, options.resume, options.force, options.no_lease},
                      reporter_, comm_.get()),
        trace_(rank_),
        peaks_(*session_.meter) {}

  ~Trainer() { set_immediate_stop_action(nullptr); }

  /// Trains from the newest checkpoint (with --resume) or from the start to train.epochs;
  /// throws as train() (trainer.h).
  void run();

 private:
  /// status.json's fields of the step where the run ended: its epoch, its step and the loss of
  /// its last step (not of the last logged one). The epoch is 0-based in every state, as
  /// metrics.jsonl's: a finished run's is its last, not the count (docs/architecture.md).
  nlohmann::json where_it_ended() const;

  /// Rank > 0's dropout stream: a function of the seed and the rank only.
  uint64_t rank_seed() const;

  /// fp16's scale and growth tracker from the checkpoint, so that the resumed steps scale, skip
  /// and grow as the uninterrupted run's would.
  void restore_scaler(const CheckpointMeta& meta, const std::string& path);

  /// Restores `loaded` (already accepted by check_resumable) into the model, optimizer and
  /// loop position, or starts fresh. A checkpoint found damaged as it is read is set aside and
  /// `loaded` becomes the one restored instead.
  /// `read_seconds`: choosing `loaded`.
  void resume_or_start(std::optional<LoadedCheckpoint>& loaded, double read_seconds);

  /// Epoch epoch_ from position_: its optimizer steps, fed by loader_, its evaluation and its
  /// end-of-epoch save.
  void run_epoch();

  /// One optimizer step over `shard`, this rank's part of the step's window of `window`
  /// samples; returns the window's mean loss. With several ranks, the gradients are summed
  /// once, after the last micro-batch (collectives.h), together with the control values every
  /// rank must agree on: the loss, a stop signal seen by any rank, a time-based save due on
  /// rank 0, and an out-of-memory error on any rank. On out of memory (any rank) the
  /// gradients are released, the micro-batch halved (global batch kept) and the same step done
  /// again on every rank.
  double optimizer_step(const at::Tensor& shard, int64_t window);

  /// Test-only (GPURUN_FAULT=hog:after_step:N): holds the capacity the plan left free less
  /// half of what a step adds to the memory in use, so that the next step runs out for real.
  void hog_memory();

  /// After out of memory: the micro-batch halved (the global batch kept), a plan event, and
  /// the loader opened again at the step's start.
  void shrink_after_oom();

  /// A loader of this epoch's micro-batches from position_ on, in the plan's micro-batches; the
  /// wait of the one it replaces stays in the step's. A single process stops waiting for a
  /// batch at a stop signal; ranks do not, since the stop must be agreed at a step boundary.
  void open_loader();

  /// Copies rank 0's buffers (BatchNorm's running statistics) to every rank. Each rank updates
  /// them from its own micro-batches, so they drift apart; the checkpoint holds rank 0's, and
  /// an evaluation or a final digest on any other statistics would describe a model that was
  /// never saved. Parameters need nothing: the synced gradients keep them identical.
  void sync_buffers();

  /// Evaluation's mean loss and accuracy over every rank's samples, through a loader of its
  /// own (epoch -1); its data wait in eval_wait_seconds_.
  std::pair<double, double> evaluate();

  /// The step's metrics (its data wait included), progress line and, every log.every_steps, its
  /// step event and status.
  void after_step(double loss, int64_t window);
  /// The epoch's mean train loss so far (per sample), 0 before its first step.
  double epoch_mean_loss() const {
    return epoch_loss_samples_ ? epoch_loss_sum_ / static_cast<double>(epoch_loss_samples_) : 0.0;
  }

  /// checkpoint.every_steps or every_minutes asks for a save after this step.
  bool due_for_checkpoint() const;

  /// What two processes must share to compute the same bits (train/resume_check.h): the
  /// config's hash, the total of optimizer steps, the run's id (run_id_), log.every_steps,
  /// the plan, threads, CPU capability and device. In the plan event; `deterministic` false
  /// (CUDA without train.deterministic) leaves resumes unchecked.
  nlohmann::json numerics() const;

  /// 16 hex digits from std::random_device.
  static std::string new_run_id();

  /// Logs the resume check's verdict (ResumeCheck::observe) and adds its resume_check event.
  void report_resume_check(const nlohmann::json& verdict);

  /// Saves the state after global_step_; `epoch` and `position` say where training continues.
  /// `metrics`: an epoch checkpoint's {eval_loss, eval_accuracy, train_loss}, recorded in its
  /// manifest (extra.metrics) for checkpoint.keep_best; null for any other checkpoint.
  void save(const std::string& reason, int64_t epoch, int64_t position,
            const nlohmann::json& metrics = nullptr);
  /// train.early_stop after an epoch's metrics: the count, the same on every rank (rank 0's).
  void observe_early_stop(const nlohmann::json& metrics);
  /// The done event's and status.json's reason: {reason: finished}, or {reason: early_stop,
  /// early_stop: EarlyStop::summary()}.
  nlohmann::json end_reason() const;

  /// Logs the scheduler's job and warns when its time limit leaves no time to save
  /// (train/scheduler_job.h); rank 0, at the start.
  void check_job_time() const;

  /// At a step boundary: when a stop signal arrived, save unless this step is saved already,
  /// then throw Stopped (exit 75). With several ranks they stop together when any rank got
  /// the signal: `agreed` is the decision carried by this step's gradient sync, otherwise a
  /// small all-reduce decides; every rank waits in a last all-reduce until rank 0's checkpoint
  /// is complete, so that the job's exit 75 means the checkpoint is there. A preemption notice
  /// (util/stop_notice.h) is a stop signal whose copy to the network tier may take until the
  /// notice's deadline (less kNoticeExitMarginSeconds), whose `signal` event records it and the
  /// seconds to a safe checkpoint, and which is acknowledged once that checkpoint is safe.
  void stop_if_signalled(std::optional<bool> agreed = std::nullopt);

  // --- unattended runs (trainer_unattended.cpp): the cost ledger, the budget, the messages ---

  /// The ledger of this attempt at the price cost.price_per_hour or the device's card's.
  CostLedger make_ledger() const;
  /// The earlier attempts from `meta`'s ledger; the last of them runs to its process's `done`
  /// event when metrics.jsonl holds it (after its last save: the stop's drain, the copy).
  void restore_ledger(const CheckpointMeta& meta);
  /// Rank 0 watches its own events: each checkpoint's measured save time, and the run's
  /// messages (plan -> started, checkpoint_failed, signal -> preempted, done -> finished or
  /// budget). Set up once the run has started.
  void watch_events();
  /// Refuses (BudgetReached) a resume whose checkpoint's ledger leaves no room in cost.budget
  /// for a step and a save, before any device time is spent on planning.
  void check_budget_at_start(const LoadedCheckpoint& loaded);
  /// Seconds one more step and a save take: the last step's (else the plan's), the last
  /// evaluation's when that step ends the epoch, and the last measured save's (else
  /// kAssumedSaveSeconds).
  double seconds_to_next_save() const;
  /// Rank 0's verdict that the next step and a save would pass cost.budget.
  bool budget_due() const;
  /// Saves (unless this step is saved), waits until the checkpoint is safe in --ckpt, and
  /// throws BudgetReached. Every rank calls it together.
  [[noreturn]] void stop_at_budget();
  /// The step checks of the budget: `agreed` is the gradient sync's verdict (several ranks).
  void stop_if_over_budget(std::optional<bool> agreed = std::nullopt);

  const RunConfig& config_;
  const RunOptions& options_;
  const Registry& registry_;
  std::unique_ptr<Collectives> comm_;  ///< null for a single process
  const int rank_, world_;
  Session session_;
  const c10::Device device_;
  const DatasetSplits& data_;
  std::shared_ptr<SegmentedModel> model_;
  nlohmann::json model_source_;  ///< plugin or TorchScript file, recorded in every manifest
  Reporter reporter_;
  Checkpointer checkpointer_;
  SampleTrace trace_;
  PeakParts peaks_;                                 ///< this epoch's peak of each part
  bool agreed_stop_ = false, agreed_save_ = false;  ///< from the last gradient sync
  bool agreed_budget_ = false;                      ///< rank 0's budget_due(), synced so
  CostLedger ledger_ = make_ledger();
  double last_step_seconds_ = 0;         ///< the last optimizer step's wall time; 0: none yet
  double eval_seconds_ = 0;              ///< the last evaluation's wall time; 0: none yet
  std::atomic<double> save_seconds_{0};  ///< the last measured save (build + write); 0: none
  double epoch_loss_sum_ = 0;            ///< sum of step loss x samples in this epoch so far
  int64_t epoch_loss_samples_ = 0;
  nlohmann::json carried_interval_;  ///< the checkpoint's StepMetrics::interval_state(); null: none
  ResumeCheck resume_check_;         ///< the stopped process's losses after the checkpoint
  at::Tensor hog_;  ///< GPURUN_FAULT=hogMIB: device memory held to force an OOM (util/faults.h)
  std::unique_ptr<StepOptimizer> optimizer_;
  std::optional<GradScaler> scaler_;  ///< fp16 only
  int64_t skipped_steps_ = 0;         ///< fp16 steps skipped for inf or NaN gradients, the run's
  nlohmann::json init_from_;          ///< InitialWeights::to_json() of model.init_from; null: none
  /// Rank 0: this run's data (data/data_fingerprint.h), recorded in every manifest.
  nlohmann::json data_fingerprint_;
  /// Random at a fresh start, then carried by every checkpoint (manifest extra.run_id): the
  /// lineage of a run, which the resume check compares (drawn from std::random_device, never
  /// from a generator that training uses).
  std::string run_id_ = new_run_id();
  MemoryPlan plan_;
  at::Tensor order_;                     ///< this epoch's permutation
  int64_t workers_ = 0, prefetch_ = 0;   ///< data.workers and data.prefetch resolved
  std::unique_ptr<BatchLoader> loader_;  ///< the rest of this epoch's micro-batches
  double data_wait_seconds_ = 0;         ///< of the step in progress
  double eval_wait_seconds_ = 0;         ///< of the last evaluation
  int64_t steps_per_epoch_ = 0, total_steps_ = 0;
  int64_t epoch_ = 0, global_step_ = 0, position_ = 0;
  /// global_step_ and epoch_ after the last step, for the immediate-stop thread.
  std::atomic<int64_t> reached_step_{0}, reached_epoch_{0};
  bool started_ = false;  ///< past the lease, directory and resume checks
  EarlyStop early_stop_{config_.train.early_stop};
  bool early_stopped_ = false;  ///< train.early_stop ended the run before train.epochs
  double lr_ = 0;
  StepMetrics metrics_;
};

}  // namespace gpurun::detail

#include "train/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include "checkpoint/checkpointer.h"
#include "checkpoint/format/checkpoint_types.h"
#include "checkpoint/format/sharded_state.h"
#include "checkpoint/format/train_state.h"
#include "checkpoint/interval.h"
#include "config/paths.h"
#include "data/data_fingerprint.h"
#include "data/loader.h"
#include "distributed/collectives.h"
#include "gpurun/config.h"
#include "gpurun/errors.h"
#include "gpurun/loss.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "memory/meter.h"
#include "memory/peak_parts.h"
#include "memory/planner.h"
#include "model/fine_tune.h"
#include "model/micro_batch_step.h"
#include "model/plugin_loader.h"
#include "model/precision.h"
#include "optim/flat_optimizer.h"
#include "optim/step_optimizer.h"
#include "optim/torch_optimizer.h"
#include "report/metrics_tail.h"
#include "report/reporter.h"
#include "train/device.h"
#include "train/immediate_stop.h"
#include "train/resume.h"
#include "train/run_setup.h"
#include "train/sample_trace.h"
#include "train/scheduler_job.h"
#include "train/step_metrics.h"
#include "train/trainer_loop.h"
#include "util/clock.h"
#include "util/faults.h"
#include "util/fs.h"
#include "util/signals.h"
#include "util/units.h"

namespace gpurun {

namespace detail {

using Clock = std::chrono::steady_clock;

void Trainer::run() {
  try {
    model_source_ = describe_model_source(config_);
    checkpointer_.claim_directory();
    const auto read_start = Clock::now();
    std::optional<LoadedCheckpoint> loaded = checkpointer_.choose();
    const double read_seconds = seconds_since(read_start);
    // The global batch is train.batch_size whatever the plan, so the run's length is known now.
    steps_per_epoch_ = steps_per_epoch(config_, data_.train->size());
    total_steps_ = steps_per_epoch_ * config_.train.epochs;
    // Refused before any probe: planning takes device time, and a refused resume needs none.
    if (loaded) check_resumable(config_, *loaded, steps_per_epoch_);
    if (loaded && options_.resume) {
      restore_ledger(loaded->meta);
      check_budget_at_start(*loaded);
    }
    // Rank 0 saves it and compares it: another rank's run ends with rank 0's refusal.
    if (rank_ == 0) {
      const DataFingerprint data = fingerprint_data(
          resolved_data(config_, false), data_.train->size(), data_.eval ? data_.eval->size() : 0);
      data_fingerprint_ = data.to_json();
      if (loaded && options_.resume)
        if (const nlohmann::json allowed = check_data(*loaded, data, options_.allow_data_change);
            !allowed.is_null())
          reporter_.event("data_change", allowed);
    }
    if (!loaded && !config_.model.init_from.empty()) init_from_ = load_init_from(*model_, config_);
    if (!loaded && config_.model.init_from.empty() && config_.model.name == "hf") {
      init_from_ = load_hf_model(*model_, config_);
      init_from_["resident_before_model_bytes"] = session_.resident_before_model_bytes;
      if (rank_ == 0) reporter_.event("weights", init_from_);
    }
    std::optional<MemoryPlan> saved;
    if (loaded && loaded->info.manifest.contains("plan"))
      saved = MemoryPlan::from_json(loaded->info.manifest["plan"]);
    plan_ = make_plan(config_, session_, world_, saved, plan_agreement(comm_.get()));
    checkpointer_.keep_host_buffers(plan_.measured.checkpoint_buffers > 0);
    checkpointer_.write_before_training(write_before_training(plan_));
    log_plan(config_, session_, plan_);
    workers_ =
        resolve_workers(config_.data.workers, device_.is_cuda(),
                        std::max(1u, std::thread::hardware_concurrency()), at::get_num_threads());
    prefetch_ = resolve_prefetch(config_.data.prefetch, workers_);
    spdlog::info("data: {} loader worker(s){}", workers_,
                 workers_ ? ", " + std::to_string(prefetch_) + " batches ahead"
                          : " (batches fetched on the training thread)");
    optimizer_ = make_step_optimizer(config_.optim,
                                     resolve_placement(config_, plan_.shard, plan_.offload, world_,
                                                       session_.precision.precision),
                                     named_trainable_parameters(*model_), comm_.get(),
                                     half_dtype(session_.precision.precision));
    if (session_.precision.precision == Precision::kFp16) scaler_.emplace(device_);
    // Dropout masks must differ between ranks: each rank > 0 draws from its own stream.
    if (rank_ > 0) torch::manual_seed(rank_seed());
    resume_or_start(loaded, read_seconds);
    if (comm_) {
      // As DDP does: every rank starts from rank 0's weights, whatever the model's init does.
      std::vector<at::Tensor> tensors;
      for (auto& entry : state_dict(*model_)) tensors.push_back(entry.second);
      comm_->broadcast_tensors(tensors);
      // A fresh start's master slice takes rank 0's weights too; a resumed one was loaded.
      if (optimizer_->flat() && !global_step_) optimizer_->flat()->reload_master_from_parameters();
    }
    started_ = true;
    reached_step_ = global_step_;
    reached_epoch_ = epoch_;
    set_immediate_stop_action([this](int sig) {
      record_immediate_stop(sig, reached_step_.load(), reached_epoch_.load(), rank_, checkpointer_,
                            reporter_, options_.ckpt_dir, ledger_.this_attempt());
    });
    // Training starts here: the rates and the ETA count from this moment (the plan event's).
    metrics_.start(global_step_, total_steps_);
    // The interval the checkpoint's process had open: the first step event covers the steps
    // since its last one, as the uninterrupted run's does (step_metrics.h).
    if (!carried_interval_.is_null() && !metrics_.continue_interval(carried_interval_)) {
      spdlog::warn(
          "the checkpoint's step_interval does not end at its global step {}; the first "
          "step event covers the resumed steps only",
          global_step_);
      resume_check_ = ResumeCheck();  // the first interval differs from the stopped run's
    }
    const double start_time = unix_seconds();
    watch_events();
    nlohmann::json plan_event = plan_.to_json();
    plan_event["time"] = start_time;
    plan_event["global_step"] = global_step_;
    plan_event["restarts"] = options_.restart_count;
    if (!options_.job.scheduler.empty()) plan_event["job"] = job_json(options_.job);
    reporter_.write_file("config.json", config_to_json(config_).dump(2) + "\n");
    if (!session_.data_stage.empty()) plan_event["data_stage"] = session_.data_stage;
    plan_event["data_workers"] = workers_;
    plan_event["data_prefetch"] = prefetch_;
    plan_event["numerics"] = numerics();
    plan_event["cost"] = ledger_.summary();
    reporter_.status({{"state", "running"},
                      {"epoch", epoch_},
                      {"global_step", global_step_},
                      {"epochs", config_.train.epochs},
                      {"total_steps", total_steps_},
                      {"restarts", options_.restart_count},
                      {"cost", ledger_.summary()},
                      {"job", job_json(options_.job)}},
                     true);
    reporter_.event("plan", plan_event);
    if (rank_ == 0) check_job_time();
    if (loaded && global_step_ == total_steps_)
      spdlog::info(
          "nothing left to train: {} has done all {} optimizer steps of train.epochs {}; it is "
          "the final checkpoint",
          loaded->info.path, total_steps_, config_.train.epochs);
    for (; epoch_ < config_.train.epochs && !early_stopped_; ++epoch_, position_ = 0) run_epoch();
    checkpointer_.finish(global_step_);  // throws when the final state is not saved
    if (comm_) comm_->barrier();  // every rank ends once rank 0's last checkpoint is complete
    reporter_.end_progress();
    spdlog::info("finished: {} epochs, {} optimizer steps, model_digest {}", epoch_, global_step_,
                 model_digest(*model_));
    nlohmann::json final_status = where_it_ended();
    final_status.update({{"state", "finished"}, {"eta_seconds", 0}});
    final_status["cost"] = ledger_.summary();
    final_status.update(end_reason());
    nlohmann::json done = {
        {"exit_code", 0}, {"global_step", global_step_}, {"attempt", ledger_.this_attempt()}};
    done.update(end_reason());
    reporter_.end_run(done, final_status);
  } catch (const std::exception& e) {
    reporter_.end_progress();
    // A run refused before it started (directory held, config changed) leaves the metrics
    // and status of the run that owns the directory as they were.
    if (!started_) throw;
    const int code = exit_code_for(e);
    nlohmann::json final_status = where_it_ended();
    final_status.update(
        {{"state", code == kExitSignal || code == kExitBudget ? "stopped" : "failed"},
         {"error", e.what()},
         {"cost", ledger_.summary()}});
    nlohmann::json done = {{"exit_code", code},
                           {"error", e.what()},
                           {"global_step", global_step_},
                           {"attempt", ledger_.this_attempt()}};
    if (code == kExitBudget) done["reason"] = "budget";
    reporter_.end_run(done, final_status);
    throw;
  }
}

nlohmann::json Trainer::where_it_ended() const {
  // An early stop has moved epoch_ past the last epoch it trained, as the end of train.epochs does.
  const int64_t last = early_stopped_ ? epoch_ - 1 : config_.train.epochs - 1;
  const int64_t epoch = std::max<int64_t>(0, std::min(epoch_, last));
  nlohmann::json fields = {{"epoch", epoch}, {"global_step", global_step_}};
  if (metrics_.last_loss()) fields["loss"] = *metrics_.last_loss();
  return fields;
}

std::string Trainer::new_run_id() {
  std::random_device device;
  const uint64_t id = (static_cast<uint64_t>(device()) << 32) ^ device();
  return fmt::format("{:016x}", id);
}

nlohmann::json Trainer::numerics() const {
  return {{"config_hash", config_hash(config_)},
          // The learning-rate schedule's length (train.epochs is not hashed: it may grow).
          {"total_steps", total_steps_},
          // This run's lineage: another run logging into the same --run-dir has another, and a
          // checkpoint folder copied elsewhere keeps it.
          {"run_id", run_id_},
          {"log_every_steps", config_.log.every_steps},
          {"world_size", world_},
          {"micro_batch", plan_.micro_batch},
          {"accumulation_steps", plan_.accumulation_steps},
          {"activation_checkpointing", plan_.activation_checkpointing},
          {"precision", plan_.precision},
          {"shard", plan_.shard},
          {"offload", plan_.offload},
          {"threads", at::get_num_threads()},
          {"cpu_capability", cpu_capability()},
          {"device", device_.str()},
          {"deterministic", !device_.is_cuda() || config_.train.deterministic}};
}

void Trainer::report_resume_check(const nlohmann::json& verdict) {
  reporter_.event("resume_check", verdict);
  reporter_.end_progress();
  if (verdict["exact"].get<bool>()) {
    spdlog::info(
        "resume check: the {} step events retrained after the resume (global steps {} to {}) "
        "hold the stopped run's losses bit for bit",
        verdict["compared_steps"].get<int64_t>(), verdict["first_step"].get<int64_t>(),
        verdict["last_step"].get<int64_t>());
    return;
  }
  spdlog::warn(
      "resume check: at global step {} the loss is {:.17g} where the stopped run logged {:.17g}, "
      "with the same numerics (hashed config, total steps, plan, threads, CPU and device): this "
      "resume is not bit-exact. Unless the data files changed since, please report it with "
      "{}/metrics.jsonl and the checkpoints",
      verdict["global_step"].get<int64_t>(), verdict["loss"].get<double>(),
      verdict["logged_loss"].get<double>(), run_dir_or_default(options_));
}

uint64_t Trainer::rank_seed() const {
  return static_cast<uint64_t>(config_.train.seed) + 1000003ULL * static_cast<uint64_t>(rank_);
}

void Trainer::restore_scaler(const CheckpointMeta& meta, const std::string& path) {
  if (!scaler_) return;
  if (meta.extra.contains("grad_scaler")) {
    scaler_->load_state_dict(meta.extra["grad_scaler"]);
    skipped_steps_ = meta.extra.value("skipped_steps", int64_t{0});
    return;
  }
  spdlog::warn(
      "{} was trained in {} and holds no gradient scaler state; fp16 starts its "
      "loss scale afresh at 65536",
      path, meta.extra.value("precision", std::string("fp32")));
}

void Trainer::resume_or_start(std::optional<LoadedCheckpoint>& loaded, double read_seconds) {
  if (!options_.resume) {
    spdlog::info("starting a new run in {}", options_.ckpt_dir);
    return;
  }
  if (!loaded) {
    spdlog::info("--resume: no checkpoint in {}; starting fresh", options_.ckpt_dir);
    return;
  }
  session_.meter->reset_peak();
  const auto restore_start = Clock::now();
  bool rng_restored = false;
  for (;;) {
    try {
      rng_restored = restore_state(*loaded, *model_, *optimizer_, rank_);
      break;
    } catch (const DamagedCheckpointError& e) {
      loaded = checkpointer_.fall_back(*loaded, e.what());
      if (!loaded) throw ResumeError(std::string(e.what()) + "; no other checkpoint is left");
      check_resumable(config_, *loaded, steps_per_epoch_);
    }
  }
  const double restore_seconds = seconds_since(restore_start);
  const CheckpointMeta& meta = loaded->meta;
  restore_ledger(meta);  // the one finally loaded
  const int64_t load_peak = session_.meter->peak_bytes();
  log_resume_differences(
      *loaded, config_,
      {session_.precision, model_source_, rank_, world_, rng_restored, steps_per_epoch_});
  epoch_ = meta.epoch;
  global_step_ = meta.global_step;
  position_ = meta.position_in_epoch;
  epoch_loss_sum_ = meta.extra.value("epoch_loss_sum", 0.0);
  epoch_loss_samples_ = meta.extra.value("epoch_loss_samples", int64_t{0});
  carried_interval_ = meta.extra.value("step_interval", nlohmann::json());
  if (meta.extra.contains("init_from")) init_from_ = meta.extra["init_from"];
  // The lineage the checkpoint belongs to (none from a gpurun that did not record it).
  run_id_ = meta.extra.contains("run_id") && meta.extra["run_id"].is_string()
                ? meta.extra["run_id"].get<std::string>()
                : std::string();
  restore_scaler(meta, loaded->info.path);
  early_stop_.restore(meta.extra.value("early_stop", nlohmann::json()));
  if (early_stop_.should_stop() && position_ == 0 && epoch_ > 0 && epoch_ < config_.train.epochs) {
    early_stopped_ = true;
    spdlog::info(
        "nothing left to train: {} is the final checkpoint of a run that stopped early ({})",
        loaded->info.path, early_stop_.reason(epoch_ - 1, config_.train.epochs));
  }
  checkpointer_.resumed_from(loaded->info.path, global_step_);
  reporter_.status({{"last_checkpoint", loaded->info.path}});
  spdlog::info("resuming from {}: epoch {}, global step {}, position {} in the epoch",
               loaded->info.path, epoch_, global_step_, position_);
  reporter_.event("resume", {{"path", loaded->info.path},
                             {"peak_bytes", load_peak},
                             {"bytes", loaded->info.bytes},
                             {"read_seconds", read_seconds},
                             {"restore_seconds", restore_seconds},
                             {"epoch", epoch_},
                             {"global_step", global_step_},
                             {"position_in_epoch", position_},
                             {"job", job_json(options_.job)}});
  // The losses the stopped process logged after the checkpoint (this one has logged no step).
  if (rank_ != 0) return;
  resume_check_.load(run_dir_or_default(options_) + "/metrics.jsonl", global_step_, numerics());
  if (resume_check_.active()) return;
  reporter_.event("resume_check", {{"compared_steps", 0},
                                   {"logged_steps", resume_check_.logged_steps()},
                                   {"reason", resume_check_.reason()}});
  // Steps were logged after the checkpoint but cannot be compared: say why. None logged (a stop
  // signal saves at the step it stops) is the common case and needs no line.
  if (resume_check_.logged_steps() > 0)
    spdlog::info(
        "resume check: the {} step events logged after the checkpoint are not compared: {}",
        resume_check_.logged_steps(), resume_check_.reason());
}

void Trainer::run_epoch() {
  const int64_t n = data_.train->size();
  order_ = epoch_permutation(n, config_.train.seed, epoch_);
  model_->train();
  auto epoch_start = Clock::now();
  peaks_.restart(&MeasuredPeaks::training);
  // A resumed epoch continues the sums its checkpoint saved, so its train loss is that of the
  // whole epoch, as without the interruption.
  if (position_ == 0) epoch_loss_sum_ = 0, epoch_loss_samples_ = 0;
  stop_if_signalled();
  stop_if_over_budget();
  open_loader();
  while (position_ < n) {
    const int64_t window = std::min(plan_.global_batch, n - position_);
    const at::Tensor shard = rank_shard(order_.narrow(0, position_, window), rank_, world_);
    const auto step_start = Clock::now();
    const double loss = optimizer_step(shard, window);
    last_step_seconds_ = seconds_since(step_start);
    trace_.record(global_step_, epoch_, shard);
    position_ += window;
    ++global_step_;
    reached_step_ = global_step_;
    reached_epoch_ = epoch_;
    epoch_loss_sum_ += loss * window;
    epoch_loss_samples_ += window;
    fault_point("after_step", global_step_);
    if (fault_fires("hog", "after_step", global_step_)) hog_memory();
    reporter_.heartbeat(global_step_);
    checkpointer_.report_finished();
    after_step(loss, window);
    if (position_ < n && due_for_checkpoint()) save("step", epoch_, position_);
    registry_.run_step_hooks({config_, rank_, epoch_, global_step_, loss, lr_});
    stop_if_signalled(agreed_stop_);
    if (position_ < n)
      stop_if_over_budget(comm_ ? std::optional<bool>(agreed_budget_) : std::nullopt);
  }
  loader_.reset();
  sync_buffers();
  peaks_.enter(&MeasuredPeaks::evaluation);
  const auto eval_start = Clock::now();
  const auto [measured_eval_loss, eval_accuracy] = evaluate();
  eval_seconds_ = seconds_since(eval_start);
  const double eval_loss = scripted_eval_loss(epoch_).value_or(measured_eval_loss);  // tests only
  peaks_.enter(nullptr);
  const double seconds = seconds_since(epoch_start);
  const double train_loss = epoch_mean_loss();
  spdlog::info("epoch {}/{}: train loss {:.4f}, eval loss {:.4f}, eval accuracy {:.4f} ({:.1f} s)",
               epoch_ + 1, config_.train.epochs, train_loss, eval_loss, eval_accuracy, seconds);
  // Hooks restore the RNG they use; on rank 0 alone, so that a sample is printed once.
  if (rank_ == 0)
    registry_.run_epoch_hooks({config_, *model_, data_, device_, epoch_, global_step_});
  reporter_.status({{"eval_loss", eval_loss}, {"eval_accuracy", eval_accuracy}});
  const nlohmann::json metrics = {
      {"eval_loss", eval_loss}, {"eval_accuracy", eval_accuracy}, {"train_loss", train_loss}};
  observe_early_stop(metrics);  // before the save, which carries the count
  save("epoch", epoch_ + 1, 0, metrics);
  // After the epoch's own save, so that its peak covers every part the plan fitted.
  const MeasuredPeaks peaks = peaks_.peaks();
  reporter_.event("epoch", {{"epoch", epoch_},
                            {"global_step", global_step_},
                            {"train_loss", train_loss},
                            {"eval_loss", eval_loss},
                            {"eval_accuracy", eval_accuracy},
                            {"peak_bytes", peaks.largest()},
                            {"eval_data_wait_seconds", eval_wait_seconds_},
                            {"measured_peaks", peaks.to_json()},
                            {"seconds", seconds}});
  stop_if_signalled();
  // The last epoch of train.epochs ends the run anyway, as finished.
  if (early_stop_.should_stop() && epoch_ + 1 < config_.train.epochs) {
    early_stopped_ = true;
    spdlog::info("{}", early_stop_.reason(epoch_, config_.train.epochs));
  }
}

void Trainer::observe_early_stop(const nlohmann::json& metrics) {
  if (!early_stop_.enabled()) return;
  early_stop_.observe(epoch_, metrics);
  // The metrics are reduced over the ranks, but a last bit's difference must not split the
  // decision (one rank stopping while the others wait in a collective): rank 0's count rules.
  if (comm_)
    early_stop_.restore(nlohmann::json::parse(comm_->broadcast(early_stop_.state().dump())));
}

nlohmann::json Trainer::end_reason() const {
  if (!early_stopped_) return {{"reason", "finished"}};
  return {{"reason", "early_stop"}, {"early_stop", early_stop_.summary()}};
}

void Trainer::after_step(double loss, int64_t window) {
  metrics_.add(global_step_, loss, window);
  metrics_.add_data_wait(data_wait_seconds_);
  data_wait_seconds_ = 0;
  // An epoch's last step is drawn whatever the throttle: the line stays during evaluation.
  const bool epoch_end = position_ >= data_.train->size();
  if (global_step_ % config_.log.every_steps != 0) {
    reporter_.progress(metrics_.progress_line(epoch_, config_.train.epochs, epoch_mean_loss()),
                       epoch_end);
    return;
  }
  const StepMetrics::Interval interval = metrics_.close_interval();
  reporter_.progress(metrics_.progress_line(epoch_, config_.train.epochs, epoch_mean_loss()),
                     epoch_end);
  const double eta = metrics_.eta_seconds();
  nlohmann::json fields = interval.event_fields(world_);
  fields.update(
      {{"epoch", epoch_}, {"global_step", global_step_}, {"lr", lr_}, {"eta_seconds", eta}});
  // The ledger over every attempt: the report draws it on the time axis.
  fields["run_seconds"] = ledger_.seconds();
  if (const std::optional<double> spent = ledger_.spent()) fields["cost"] = *spent;
  if (scaler_) {
    fields["loss_scale"] = scaler_->scale_value();
    fields["skipped_steps"] = skipped_steps_;  // of the run, inf or NaN gradients
  }
  reporter_.event("step", fields);
  if (std::optional<nlohmann::json> verdict =
          resume_check_.observe(global_step_, interval.mean_loss))
    report_resume_check(*verdict);
  reporter_.status({{"epoch", epoch_},
                    {"global_step", global_step_},
                    {"loss", interval.mean_loss},
                    {"samples_per_second", interval.samples_per_second},
                    {"eta_seconds", eta},
                    {"cost", ledger_.summary()}});
}

bool Trainer::due_for_checkpoint() const {
  const auto& c = config_.checkpoint;
  if (c.every_steps > 0 && global_step_ % c.every_steps == 0) return true;
  // Clocks differ between ranks: rank 0's decides, carried by the gradient sync.
  return comm_ ? agreed_save_ : checkpointer_.minutes_due();
}

void Trainer::save(const std::string& reason, int64_t epoch, int64_t position,
                   const nlohmann::json& metrics) {
  CheckpointMeta meta;
  meta.epoch = epoch;
  meta.global_step = global_step_;
  meta.position_in_epoch = position;
  meta.world_size = world_;
  meta.config_hash = config_hash(config_);
  meta.config = config_to_json(config_);
  meta.plan = plan_.to_json();
  meta.extra = {{"reason", reason},
                {"device", device_.str()},
                // On the CPU always; on CUDA only with deterministic cuBLAS and cuDNN.
                {"deterministic", !device_.is_cuda() || config_.train.deterministic},
                {"precision", precision_name(session_.precision.precision)}};
  if (scaler_) {
    meta.extra["grad_scaler"] = scaler_->state_dict();
    meta.extra["skipped_steps"] = skipped_steps_;
  }
  // The step events' open interval, so that a resume logs what the uninterrupted run would.
  meta.extra["step_interval"] = metrics_.interval_state();
  if (!init_from_.is_null()) meta.extra["init_from"] = init_from_;
  meta.extra["run_id"] = run_id_;
  meta.extra["cost"] = ledger_.to_json();  // every attempt so far, this one up to now
  if (!data_fingerprint_.is_null()) meta.extra["data"] = data_fingerprint_;
  if (position > 0) {
    meta.extra["epoch_loss_sum"] = epoch_loss_sum_;
    meta.extra["epoch_loss_samples"] = epoch_loss_samples_;
  }
  if (!model_source_.empty()) meta.extra["model_source"] = model_source_;
  // Decodes the model's outputs without the data (e.g. a text model's characters).
  if (!data_.class_names.empty()) meta.extra["class_names"] = data_.class_names;
  // What checkpoint.keep_best ranks by, and the early stop's count as of the last epoch's end.
  if (!metrics.is_null()) meta.extra["metrics"] = metrics;
  if (early_stop_.enabled()) meta.extra["early_stop"] = early_stop_.state();
  const PeakParts::Part was = peaks_.enter(&MeasuredPeaks::checkpoint_capture);
  checkpointer_.save(std::move(meta), *model_, *optimizer_);
  peaks_.enter(was);
}

void Trainer::check_job_time() const {
  if (options_.job.scheduler.empty()) return;
  StopCost cost;
  cost.step_seconds = plan_.step_seconds * static_cast<double>(plan_.accumulation_steps);
  cost.save_seconds = kAssumedSaveSeconds;
  // The save the previous start of this job (or run) measured: a requeued job's best guess.
  if (const auto last =
          last_event_in_tail(run_dir_or_default(options_) + "/metrics.jsonl", "checkpoint")) {
    cost.save_seconds = last->value("build_seconds", 0.0) + last->value("write_seconds", 0.0);
    cost.save_measured = true;
  }
  const JobLines lines = describe_job(options_.job, cost, unix_seconds());
  spdlog::info("{}", lines.info);
  for (const std::string& w : lines.warnings) spdlog::warn("{}", w);
}

}  // namespace detail

std::string run_dir_or_default(const RunOptions& options) {
  if (!options.run_dir.empty()) return options.run_dir;
  return Checkpointer::default_run_dir(options.ckpt_dir);
}

void train(const RunConfig& config, const RunOptions& options, const Registry& registry) {
  if (options.ckpt_dir.empty()) throw ConfigError("--ckpt DIR is required to train");
  for (const std::string& dir : {options.ckpt_dir, options.run_dir}) {
    std::error_code ec;
    if (!dir.empty() && std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
      throw ConfigError(dir + " exists and is not a directory");
  }
  // Before the data and the model are loaded: a run that could save nothing does not start.
  if (!options.dist || options.dist->rank == 0) Checkpointer::check_writable(options.ckpt_dir);
  std::unique_ptr<Collectives> comm;
  if (options.dist && options.dist->world_size > 1) {
    const DistEnv& d = *options.dist;
    const std::string run_dir = run_dir_or_default(options);
    // Every rank keeps its own log (docs/architecture.md); rank 0's also goes to stderr as usual.
    fs::make_dirs(run_dir);
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(
        run_dir + "/rank-" + std::to_string(d.rank) + ".log");
    spdlog::default_logger()->sinks().push_back(file);
    // Every line reaches the file at once: a rank killed outright keeps its last words.
    spdlog::default_logger()->flush_on(spdlog::level::trace);
    spdlog::default_logger()->set_pattern("%^gpurun %l%$ [rank " + std::to_string(d.rank) + "] %v");
    const c10::Device device = select_device(options.device, d.local_rank);
    comm = Collectives::connect(d, device, config.distributed.timeout);
  }
  detail::Trainer(config, options, registry, std::move(comm)).run();
}

}  // namespace gpurun

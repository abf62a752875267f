#include "gpurun/trainer.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <spdlog/spdlog.h>

#include "gpurun/checkpoint.h"
#include "gpurun/checkpoint_writer.h"
#include "gpurun/errors.h"
#include "gpurun/faults.h"
#include "gpurun/fs.h"
#include "gpurun/model.h"
#include "gpurun/optim.h"
#include "gpurun/lease.h"
#include "gpurun/loss.h"
#include "gpurun/memory_meter.h"
#include "gpurun/memory_plan.h"
#include "gpurun/registry.h"
#include "gpurun/session.h"
#include "gpurun/signals.h"
#include "gpurun/state.h"
#include "gpurun/status.h"
#include "gpurun/step.h"

namespace gpurun {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// Test-only: GPURUN_TRACE_SAMPLES=FILE appends, per optimizer step, "STEP EPOCH i i i ...",
/// STEP being the 0-based global step, and the sample indices the step consumed (used to prove that
/// resume neither repeats nor skips).
class SampleTrace {
 public:
  SampleTrace() {
    if (const char* path = std::getenv("GPURUN_TRACE_SAMPLES")) path_ = path;
  }
  void record(int64_t step, int64_t epoch, const at::Tensor& indices) {
    if (path_.empty()) return;
    std::string line = std::to_string(step) + " " + std::to_string(epoch);
    const int64_t* p = indices.data_ptr<int64_t>();
    for (int64_t i = 0; i < indices.numel(); ++i) line += " " + std::to_string(p[i]);
    fs::append_line(path_, line);
  }

 private:
  std::string path_;
};

class Trainer {
 public:
  Trainer(const RunConfig& config, const RunOptions& options, const Registry& registry)
      : config_(config),
        options_(options),
        registry_(registry),
        session_(open_session(config, options.device, options.memory_limit, registry)),
        device_(session_.device),
        data_(session_.data),
        model_(session_.model),
        store_(options.ckpt_dir, config.checkpoint.keep_last),
        reporter_(options.run_dir.empty() ? options.ckpt_dir : options.run_dir, true) {}

  void run() {
    try {
      take_lease();
      check_directory();
      plan_ = make_plan(config_, session_, /*world_size=*/1, saved_plan());
      log_plan();
      params_ = model_->parameters();
      optimizer_ = make_optimizer(config_.optim, params_);
      const int64_t n = data_.train->size();
      steps_per_epoch_ = (n + plan_.global_batch - 1) / plan_.global_batch;
      total_steps_ = steps_per_epoch_ * config_.train.epochs;
      resume_or_start();
      started_ = true;
      reporter_.event("plan", plan_.to_json());
      reporter_.status({{"state", "running"},
                        {"epochs", config_.train.epochs},
                        {"total_steps", total_steps_},
                        {"restarts", options_.restart_count}},
                       true);
      for (; epoch_ < config_.train.epochs; ++epoch_, position_ = 0) run_epoch();
      drain_writes();
      reporter_.end_progress();
      spdlog::info("finished: {} epochs, {} optimizer steps, model_digest {}", epoch_, global_step_,
                   model_digest(*model_));
      reporter_.event("done", {{"exit_code", 0}, {"global_step", global_step_}});
      reporter_.status({{"state", "finished"}, {"eta_seconds", 0}}, true);
    } catch (const std::exception& e) {
      reporter_.end_progress();
      // A run refused before it started (directory held, config changed) leaves the metrics
      // and status of the run that owns the directory as they were.
      if (!started_) throw;
      const int code = exit_code_for(e);
      reporter_.event("done", {{"exit_code", code}, {"error", e.what()}});
      reporter_.status({{"state", code == kExitSignal ? "stopped" : "failed"}, {"error", e.what()}},
                       true);
      throw;
    }
  }

 private:
  /// Holds DIR/lease.json for the whole run, so that two machines never interleave
  /// checkpoints in one directory. A target where the lease cannot be written (read-only,
  /// full) is reported and training goes on: its saves fail and are reported the same way.
  void take_lease() {
    try {
      lease_ = Lease::acquire(options_.ckpt_dir, config_.checkpoint.lease_timeout, options_.force);
    } catch (const IoError& e) {
      spdlog::error("cannot hold the lease of {}: {}; training goes on, but checkpoints will "
                    "fail the same way",
                    options_.ckpt_dir, e.what());
    }
  }

  /// Refuses a directory that holds checkpoints unless resuming; cleans leftover temporaries.
  void check_directory() {
    store_.clean_temporaries();
    if (!options_.resume && store_.has_checkpoints())
      throw ConfigError(options_.ckpt_dir + " already holds checkpoints (" +
                        store_.list(false).back().name +
                        "); continue them with --resume, or use a new --ckpt directory");
  }

  /// The plan stored in the newest complete checkpoint, when resuming.
  std::optional<MemoryPlan> saved_plan() const {
    if (!options_.resume) return std::nullopt;
    auto checkpoints = store_.list(false);
    for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it)
      if (it->complete && it->manifest.contains("plan"))
        return MemoryPlan::from_json(it->manifest["plan"]);
    return std::nullopt;
  }

  void log_plan() const {
    const int64_t measured = plan_.measured_peak_bytes, estimated = plan_.estimated_peak_bytes;
    spdlog::info("memory plan: micro-batch {} x accumulation {} x world {} = global batch {}{}; "
                 "eval batch {} ({})",
                 plan_.micro_batch, plan_.accumulation_steps, plan_.world_size,
                 plan_.global_batch, plan_.activation_checkpointing ? ", activation checkpointing" : "",
                 plan_.eval_batch, plan_.reason);
    spdlog::info("peak memory: measured {}, estimated {} ({:+.0f}%), capacity {}",
                 format_bytes(measured), format_bytes(estimated),
                 measured > 0 ? 100.0 * (estimated - measured) / measured : 0.0,
                 format_bytes(plan_.capacity_bytes));
  }

  void resume_or_start() {
    if (!options_.resume) {
      spdlog::info("starting a new run in {}", options_.ckpt_dir);
      return;
    }
    std::optional<LoadedCheckpoint> loaded = store_.load_latest();
    if (!loaded) {
      spdlog::info("--resume: no checkpoint in {}; starting fresh", options_.ckpt_dir);
      return;
    }
    const CheckpointMeta& meta = loaded->meta;
    if (meta.config_hash != config_hash(config_)) {
      std::string keys;
      for (const auto& k : changed_training_keys(config_from_json(meta.config), config_))
        keys += "\n  " + k;
      throw ResumeError("cannot resume " + loaded->info.path +
                        ": training keys differ from the checkpoint's config:" + keys +
                        "\n(extending train.epochs is allowed; otherwise use a new --ckpt "
                        "directory)");
    }
    if (meta.threads != at::get_num_threads() || meta.cpu_capability != cpu_capability())
      spdlog::warn(
          "checkpoint was written with {} threads and CPU capability {}; this run uses "
          "{} and {}: results will differ in the last bits",
          meta.threads, meta.cpu_capability, at::get_num_threads(), cpu_capability());
    session_.meter->reset_peak();
    restore_state(*loaded, *model_, *optimizer_);
    const int64_t load_peak = session_.meter->peak_bytes();
    epoch_ = meta.epoch;
    global_step_ = meta.global_step;
    position_ = meta.position_in_epoch;
    last_saved_step_ = global_step_;
    last_checkpoint_ = loaded->info.path;
    reporter_.status({{"last_checkpoint", last_checkpoint_}});
    spdlog::info("resuming from {}: epoch {}, global step {}, position {} in the epoch",
                 loaded->info.path, epoch_, global_step_, position_);
    reporter_.event("resume", {{"path", loaded->info.path},
                               {"peak_bytes", load_peak},
                               {"epoch", epoch_},
                               {"global_step", global_step_},
                               {"position_in_epoch", position_}});
  }

  void run_epoch() {
    const int64_t n = data_.train->size();
    const at::Tensor order = epoch_permutation(n, config_.train.seed, epoch_);
    model_->train();
    auto epoch_start = Clock::now();
    session_.meter->reset_peak();
    double loss_sum = 0;
    int64_t loss_samples = 0;
    stop_if_signalled();
    while (position_ < n) {
      const int64_t window = std::min(plan_.global_batch, n - position_);
      const at::Tensor indices = order.narrow(0, position_, window);
      const double loss = optimizer_step(indices);
      trace_.record(global_step_, epoch_, indices);
      position_ += window;
      ++global_step_;
      loss_sum += loss * window;
      loss_samples += window;
      fault_point("after_step", global_step_);
      reporter_.heartbeat();
      report_finished_writes();
      after_step(loss, window);
      if (position_ < n && due_for_checkpoint()) save("step", epoch_, position_);
      stop_if_signalled();
    }
    const auto [eval_loss, eval_accuracy] = evaluate();
    const double seconds = seconds_since(epoch_start);
    reporter_.end_progress();
    const double train_loss = loss_samples ? loss_sum / loss_samples : 0.0;
    spdlog::info(
        "epoch {}/{}: train loss {:.4f}, eval loss {:.4f}, eval accuracy {:.4f} ({:.1f} s)",
        epoch_ + 1, config_.train.epochs, train_loss, eval_loss, eval_accuracy, seconds);
    reporter_.event("epoch", {{"epoch", epoch_},
                              {"global_step", global_step_},
                              {"train_loss", train_loss},
                              {"eval_loss", eval_loss},
                              {"eval_accuracy", eval_accuracy},
                              {"peak_bytes", session_.meter->peak_bytes()},
                              {"seconds", seconds}});
    registry_.run_epoch_hooks({config_, *model_, data_, device_, epoch_, global_step_});
    save("epoch", epoch_ + 1, 0);
    stop_if_signalled();
  }

  /// One optimizer step over `indices`, the window of this step; returns its mean loss. On
  /// c10's out-of-memory error the gradients are released, the micro-batch halved (global
  /// batch kept) and the same step done again.
  double optimizer_step(const at::Tensor& indices) {
    for (;;) {
      try {
        optimizer_->zero_grad();
        const double loss =
            accumulate_gradients(*model_, *data_.train, indices, plan_.micro_batch, device_);
        if (config_.optim.grad_clip > 0) clip_grad_norm(params_, config_.optim.grad_clip);
        lr_ = learning_rate(config_.optim, config_.schedule, global_step_, total_steps_);
        set_learning_rate(*optimizer_, lr_);
        optimizer_->step();
        return loss;
      } catch (const c10::OutOfMemoryError& e) {
        for (auto& p : params_) p.mutable_grad() = at::Tensor();
        MemoryPlan smaller = halve_micro_batch(plan_);
        reporter_.end_progress();
        spdlog::warn("out of memory at global step {} with micro-batch {}; memory back to {}; "
                     "retrying with micro-batch {} x accumulation {}",
                     global_step_, plan_.micro_batch, format_bytes(session_.meter->current_bytes()),
                     smaller.micro_batch, smaller.accumulation_steps);
        plan_ = smaller;
        reporter_.event("plan", plan_.to_json());
      }
    }
  }

  std::pair<double, double> evaluate() {
    model_->eval();
    torch::NoGradGuard no_grad;
    const int64_t n = data_.eval->size();
    double loss_sum = 0;
    int64_t correct = 0, positions = 0;  // accuracy over every target (sample or token)
    for (int64_t start = 0; start < n; start += plan_.eval_batch) {
      const int64_t count = std::min(plan_.eval_batch, n - start);
      reporter_.heartbeat();
      Batch batch = data_.eval->get(at::arange(start, start + count, at::kLong));
      at::Tensor logits = model_->forward(batch.inputs.to(device_));
      at::Tensor targets = batch.targets.to(device_);
      loss_sum += session_.loss(logits, targets).item<double>() * count;
      correct += correct_predictions(logits, targets);
      positions += targets.numel();
    }
    model_->train();
    return {n ? loss_sum / n : 0.0, positions ? static_cast<double>(correct) / positions : 0.0};
  }

  void after_step(double loss, int64_t window) {
    // samples/s over the steps since the last report, which excludes evaluation and saves.
    interval_samples_ += window;
    interval_loss_ += loss * window;
    const double elapsed = seconds_since(interval_start_);
    const int64_t remaining = total_steps_ - global_step_;
    const double eta = throughput_ > 0 ? remaining * plan_.global_batch / throughput_ : -1;
    reporter_.progress(progress_line(loss, eta));
    if (global_step_ % config_.log.every_steps != 0) return;
    throughput_ = elapsed > 0 ? interval_samples_ / elapsed : 0;
    const double mean_loss = interval_loss_ / interval_samples_;
    reporter_.event("step", {{"epoch", epoch_},
                             {"global_step", global_step_},
                             {"loss", mean_loss},
                             {"lr", lr_},
                             {"samples_per_second", throughput_}});
    reporter_.status({{"epoch", epoch_},
                      {"global_step", global_step_},
                      {"loss", mean_loss},
                      {"samples_per_second", throughput_},
                      {"eta_seconds", eta}});
    interval_samples_ = 0;
    interval_loss_ = 0;
    interval_start_ = Clock::now();
  }

  std::string progress_line(double loss, double eta) const {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "epoch %lld/%lld  step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s",
                  static_cast<long long>(epoch_ + 1), static_cast<long long>(config_.train.epochs),
                  static_cast<long long>(global_step_), static_cast<long long>(total_steps_), loss,
                  throughput_, format_duration(eta).c_str());
    return buf;
  }

  bool due_for_checkpoint() const {
    const auto& c = config_.checkpoint;
    if (c.every_steps > 0 && global_step_ % c.every_steps == 0) return true;
    return c.every_minutes > 0 && seconds_since(last_save_time_) >= c.every_minutes * 60;
  }

  /// Saves the state after global_step_; `epoch` and `position` say where training continues.
  void save(const std::string& reason, int64_t epoch, int64_t position) {
    if (lease_ && (lease_->lost() || !lease_->still_ours()))
      throw ConfigError("another run took over " + options_.ckpt_dir +
                        " (lease.json); stopping without saving, so that two runs never "
                        "interleave checkpoints");
    CheckpointMeta meta;
    meta.epoch = epoch;
    meta.global_step = global_step_;
    meta.position_in_epoch = position;
    meta.world_size = plan_.world_size;
    meta.config_hash = config_hash(config_);
    meta.config = config_to_json(config_);
    meta.plan = plan_.to_json();
    meta.extra = {{"reason", reason}};
    // Decodes the model's outputs without the data (e.g. a text model's characters).
    if (!data_.class_names.empty()) meta.extra["class_names"] = data_.class_names;
    // The stall: copying the state to host memory, plus waiting for a write still in flight.
    const auto stall_start = Clock::now();
    writer_.submit(capture_state(*model_, *optimizer_, std::move(meta)));
    stalls_[global_step_] = seconds_since(stall_start);
    last_saved_step_ = global_step_;
    last_save_time_ = Clock::now();
    report_finished_writes();
    interval_start_ = Clock::now();  // keep the save out of the samples/s measurement
  }

  /// Reports the background writes that finished: a `checkpoint` event for each success; for
  /// a failure an error that keeps training going (the last complete checkpoint is untouched)
  /// until checkpoint.max_failures saves in a row have failed.
  void report_finished_writes() {
    for (WriteOutcome& o : writer_.finished()) {
      const int64_t step = o.meta.global_step;
      const double stall = stalls_[step];
      stalls_.erase(step);
      if (!o.result) {
        ++failed_saves_;
        reporter_.end_progress();
        spdlog::error("checkpoint of global step {} failed: {}; the last complete checkpoint "
                      "({}) is untouched; training goes on and saves again at the next "
                      "checkpoint ({} of {} failures in a row)",
                      step, o.error, last_checkpoint_.empty() ? "none" : last_checkpoint_,
                      failed_saves_, config_.checkpoint.max_failures);
        reporter_.event("checkpoint_failed", {{"global_step", step}, {"error", o.error},
                                              {"errno", o.error_number},
                                              {"failures_in_a_row", failed_saves_}});
        if (failed_saves_ >= config_.checkpoint.max_failures)
          throw Error("stopping: " + std::to_string(failed_saves_) +
                      " checkpoints in a row failed; last error: " + o.error);
        continue;
      }
      failed_saves_ = 0;
      const SaveResult& r = *o.result;
      last_checkpoint_ = r.path;
      const double save_seconds = stall + r.write_seconds;
      if (!warned_grace_ && save_seconds > config_.checkpoint.grace_seconds) {
        warned_grace_ = true;
        spdlog::warn("a checkpoint takes {:.1f} s, more than checkpoint.grace_seconds ({:.0f} s): "
                     "a spot reclaim or Slurm's signal may not leave time to save",
                     save_seconds, config_.checkpoint.grace_seconds);
      }
      reporter_.event("checkpoint", {{"path", r.path},
                                     {"epoch", o.meta.epoch},
                                     {"global_step", step},
                                     {"bytes", r.bytes},
                                     {"stall_seconds", stall},
                                     {"write_seconds", r.write_seconds}});
      reporter_.status({{"last_checkpoint", r.path}}, true);
    }
  }

  /// Waits for the write in flight and reports it.
  void drain_writes() {
    writer_.wait();
    report_finished_writes();
  }

  /// At a step boundary: when a stop signal arrived, save unless this step is saved already,
  /// then throw Stopped (exit 75).
  void stop_if_signalled() {
    const int sig = stop_signal();
    if (!sig) return;
    reporter_.end_progress();
    spdlog::warn("received signal {}; saving at global step {} and stopping", sig, global_step_);
    reporter_.event("signal", {{"signal", sig}, {"global_step", global_step_}});
    if (global_step_ != last_saved_step_) save("signal", epoch_, position_);
    drain_writes();
    throw Stopped(sig);
  }

  const RunConfig& config_;
  const RunOptions& options_;
  const Registry& registry_;
  Session session_;
  const c10::Device device_;
  const DatasetSplits& data_;
  std::shared_ptr<SegmentedModel> model_;
  CheckpointStore store_;
  Reporter reporter_;
  std::unique_ptr<Lease> lease_;  ///< released after the last write (declared before writer_)
  CheckpointWriter writer_{store_, config_.checkpoint.async};
  SampleTrace trace_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  MemoryPlan plan_;
  int64_t steps_per_epoch_ = 0, total_steps_ = 0;
  int64_t epoch_ = 0, global_step_ = 0, position_ = 0;
  std::map<int64_t, double> stalls_;  ///< global step -> stall of its save, until reported
  int64_t failed_saves_ = 0;
  bool warned_grace_ = false;
  bool started_ = false;  ///< past the lease, directory and resume checks
  int64_t last_saved_step_ = 0;  // step 0 needs no checkpoint: resuming from none is fresh
  double lr_ = 0;
  std::string last_checkpoint_;
  Clock::time_point last_save_time_ = Clock::now();
  Clock::time_point interval_start_ = Clock::now();
  int64_t interval_samples_ = 0;
  double interval_loss_ = 0, throughput_ = 0;
};

}  // namespace

void train(const RunConfig& config, const RunOptions& options, const Registry& registry) {
  if (options.ckpt_dir.empty()) throw ConfigError("--ckpt DIR is required to train");
  for (const std::string& dir : {options.ckpt_dir, options.run_dir}) {
    std::error_code ec;
    if (!dir.empty() && std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
      throw ConfigError(dir + " exists and is not a directory");
  }
  Trainer(config, options, registry).run();
}

}  // namespace gpurun

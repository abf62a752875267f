#include "checkpoint/checkpointer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "checkpoint/lease.h"
#include "checkpoint/state_copy.h"
#include "checkpoint/train_state.h"
#include "distributed/collectives.h"
#include "gpurun/errors.h"
#include "report/reporter.h"
#include "util/clock.h"
#include "util/fs.h"

namespace gpurun {
Checkpointer::Checkpointer(const RunConfig& config, CheckpointOptions options, Reporter& reporter,
                           Collectives* comm)
    : config_(config),
      options_(std::move(options)),
      reporter_(reporter),
      comm_(comm),
      rank_(comm ? comm->rank() : 0),
      store_(options_.ckpt_dir, config.checkpoint.keep_last),
      copy_(std::make_unique<HostStateCopy>()),
      writer_(store_, config.checkpoint.async) {}

Checkpointer::~Checkpointer() = default;

void Checkpointer::check_writable(const std::string& dir) {
  const std::string probe = dir + "/.gpurun-write-probe-" + std::to_string(::getpid());
  try {
    fs::make_dirs(dir);
    fs::write_file(probe, "gpurun write probe\n");
    if (::unlink(probe.c_str()) != 0) throw IoError("unlink", probe, errno);
  } catch (const IoError& e) {
    throw ConfigError("checkpoint directory " + dir + " cannot be written (" + e.what() +
                      "); choose a --ckpt directory where files can be created");
  }
}

void Checkpointer::claim_directory() {
  if (rank_ != 0) return;
  check_writable(options_.ckpt_dir);
  try {
    lease_ = Lease::acquire(options_.ckpt_dir, config_.checkpoint.lease_timeout, options_.force);
  } catch (const IoError& e) {
    throw ConfigError("cannot hold the lease of " + options_.ckpt_dir + " (" + e.what() +
                      "); without it two runs could write into one checkpoint directory, so "
                      "this run does not start");
  }
  store_.clean_temporaries();
  if (!options_.resume && store_.has_checkpoints())
    throw ConfigError(options_.ckpt_dir + " already holds checkpoints (" +
                      store_.list(false).back().name +
                      "); continue them with --resume, or use a new --ckpt directory");
}

std::optional<LoadedCheckpoint> Checkpointer::choose() {
  std::optional<LoadedCheckpoint> loaded;
  if (options_.resume && rank_ == 0) loaded = store_.load_latest();
  if (!comm_) return loaded;
  const std::string path = comm_->broadcast(loaded ? loaded->info.path : "");
  if (rank_ != 0 && !path.empty()) loaded = CheckpointStore::load(path);
  return loaded;
}

void Checkpointer::resumed_from(const std::string& path, int64_t global_step) {
  last_saved_step_ = last_complete_step_ = global_step;
  last_checkpoint_ = path;
}

std::string Checkpointer::not_saved(std::optional<int64_t> reached) const {
  if (last_checkpoint_.empty()) {
    return (reached ? "none of its " + std::to_string(*reached) + " optimizer steps is saved"
                    : std::string("nothing of this run is saved")) +
           ": there is no complete checkpoint of it in " + options_.ckpt_dir;
  }
  if (reached && *reached == last_complete_step_)
    return "global step " + std::to_string(*reached) + " is saved in " + last_checkpoint_;
  const std::string steps =
      reached ? "the " + std::to_string(*reached - last_complete_step_) + " optimizer steps"
              : std::string("the steps");
  return steps + " after global step " + std::to_string(last_complete_step_) +
         " are not saved; the newest complete checkpoint is " + last_checkpoint_;
}

void Checkpointer::check_lease() const {
  if (!lease_ || !(lease_->lost() || lease_->expired())) return;
  const std::string message = lease_->trouble() +
                              ". Stopping without saving, so that two runs never interleave "
                              "checkpoints: " +
                              not_saved(std::nullopt);
  // Taken by a live run: retrying would only wait for it (exit 2, never retried). Expired:
  // the storage failed, and a restart takes the lease again once it works (exit 1).
  if (lease_->lost()) throw ConfigError(message);
  throw Error(message);
}

bool Checkpointer::minutes_due() const {
  const double every = config_.checkpoint.every_minutes;
  return every > 0 && seconds_since(last_save_time_) >= every * 60;
}

void Checkpointer::save(CheckpointMeta meta, const torch::nn::Module& model,
                        torch::optim::Optimizer& optimizer) {
  const int64_t step = meta.global_step;
  // Every rank's random state goes into rank 0's trainer.pt; the other ranks write nothing.
  std::vector<NamedTensors> rank_rng;
  if (comm_) {
    const std::vector<std::string> states =
        comm_->gather(pickle_tensors(process_rng_states(model_device(model))));
    for (size_t r = 1; r < states.size(); ++r)
      rank_rng.push_back(
          unpickle_tensors(states[r], "rank " + std::to_string(r) + "'s random state"));
  }
  if (rank_ == 0) {
    // Re-read now, not only as the heartbeat last saw it: a save must never follow a takeover.
    if (lease_) lease_->still_ours();
    check_lease();
    // The stall: waiting for a write still in flight (its build reads the host copy), then
    // copying the state into the host copy. The digest, pickling and the optimizer's archive
    // are the writer thread's.
    const auto stall_start = Clock::now();
    writer_.wait();
    copy_->copy(model, optimizer, trainer_rng_states(model, rank_rng));
    CheckpointSnapshot snapshot;
    snapshot.meta = std::move(meta);
    writer_.submit(std::move(snapshot),
                   [copy = copy_.get()](CheckpointSnapshot& s) { copy->build(s); });
    stalls_[step] = seconds_since(stall_start);
  }
  last_saved_step_ = step;
  last_save_time_ = Clock::now();
  report_finished();
}

void Checkpointer::report_finished() {
  for (WriteOutcome& o : writer_.finished()) {
    const int64_t step = o.meta.global_step;
    const double stall = stalls_[step];
    stalls_.erase(step);
    if (!o.result) {
      ++failed_saves_;
      last_error_ = o.error;
      reporter_.event("checkpoint_failed", {{"global_step", step},
                                            {"error", o.error},
                                            {"errno", o.error_number},
                                            {"failures_in_a_row", failed_saves_}});
      reporter_.end_progress();
      // The last epoch's save: no training goes on after it; finish() says what is lost.
      if (o.meta.epoch >= config_.train.epochs && o.meta.position_in_epoch == 0) {
        spdlog::error("checkpoint of global step {} failed: {}", step, o.error);
        continue;
      }
      spdlog::error(
          "checkpoint of global step {} failed: {}; the last complete checkpoint "
          "({}) is untouched; training goes on and saves again at the next "
          "checkpoint ({} of {} failures in a row)",
          step, o.error, last_checkpoint_.empty() ? "none" : last_checkpoint_, failed_saves_,
          config_.checkpoint.max_failures);
      if (failed_saves_ >= config_.checkpoint.max_failures)
        throw Error("stopping: " + std::to_string(failed_saves_) +
                    " checkpoints in a row failed; last error: " + o.error + "; " +
                    not_saved(last_saved_step_));
      continue;
    }
    failed_saves_ = 0;
    const SaveResult& r = *o.result;
    last_checkpoint_ = r.path;
    last_complete_step_ = step;
    // Synchronous saves build and write inside the stall.
    const double save_seconds =
        config_.checkpoint.async ? stall + o.build_seconds + r.write_seconds : stall;
    if (!warned_grace_ && save_seconds > config_.checkpoint.grace_seconds) {
      warned_grace_ = true;
      spdlog::warn(
          "a checkpoint takes {:.1f} s, more than checkpoint.grace_seconds ({:.0f} s): "
          "a spot reclaim or Slurm's signal may not leave time to save",
          save_seconds, config_.checkpoint.grace_seconds);
    }
    reporter_.event("checkpoint", {{"path", r.path},
                                   {"epoch", o.meta.epoch},
                                   {"global_step", step},
                                   {"bytes", r.bytes},
                                   {"stall_seconds", stall},
                                   {"build_seconds", o.build_seconds},
                                   {"write_seconds", r.write_seconds}});
    reporter_.status({{"last_checkpoint", r.path}}, true);
  }
  check_lease();
}

void Checkpointer::drain() {
  writer_.wait();
  report_finished();
}

void Checkpointer::finish(int64_t global_step) {
  drain();
  bool complete = rank_ != 0 || last_complete_step_ == global_step;
  if (comm_) complete = comm_->all_reduce({complete ? 0.0 : 1.0}, Collectives::Op::kMax)[0] == 0;
  if (complete) return;
  if (rank_ != 0)
    throw Error("rank 0 could not write the final checkpoint (global step " +
                std::to_string(global_step) + "); its log says why");
  throw Error("the final checkpoint (global step " + std::to_string(global_step) +
              ") was not written" + (last_error_.empty() ? "" : ": " + last_error_) + "; " +
              not_saved(global_step) + "; the trained model is not saved");
}

}  // namespace gpurun

#include "checkpoint/checkpointer.h"

#include <cstdlib>

#include "checkpoint/storage/checkpoint_storage.h"
#include "s3/s3_settings.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpoint/format/folder.h"
#include "checkpoint/format/state_copy.h"
#include "checkpoint/format/train_state.h"
#include "checkpoint/interval.h"
#include "checkpoint/storage/lease.h"
#include "checkpoint/tier_copy.h"
#include "distributed/collectives.h"
#include "gpurun/errors.h"
#include "report/reporter.h"
#include "util/bracket.h"
#include "util/clock.h"
#include "util/detached_call.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/signals.h"
#include "util/writable.h"

namespace gpurun {
namespace {
namespace stdfs = std::filesystem;

// How long a stop or the end of a run waits for the network tier to be listed.
constexpr double kNetworkListSeconds = 0.5;

// The newest complete step of the network tier `dir`, listed on a thread of its own: nullopt
// when that fails or takes longer than kNetworkListSeconds (storage that does not answer).
std::optional<int64_t> network_newest_step(const std::string& dir) {
  try {
    return call_within<int64_t>(kNetworkListSeconds,
                                [dir] { return CheckpointView(dir).newest_complete_step(); });
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

namespace {

// "exp1-1a2b3c4d" for s3://bucket/runs/exp1.
std::string object_root_key(const std::string& ckpt_dir) {
  // Named after the normalized URL: s3://b/x/ and s3://b/x are one root.
  const std::string url = S3Url::parse(ckpt_dir)->str();
  return split_folder_path(url).second + "-" + xxh3_hex(url).substr(0, 8);
}

}  // namespace

std::string Checkpointer::local_tier_root(const RunConfig& config, const std::string& ckpt_dir) {
  const std::string& dir = config.checkpoint.local_dir;
  if (dir == kNoLocalTier) return "";
  if (!dir.empty() || !is_object_root(ckpt_dir)) return dir;
  // A bucket is reached over the network: a save lands on the local disk first, as fast as a
  // local save, and is uploaded behind training (docs/architecture.md, "Object storage").
  return fs::cache_dir() + "/tiers";
}

std::string Checkpointer::default_run_dir(const std::string& ckpt_dir) {
  if (!is_object_root(ckpt_dir)) return ckpt_dir;
  return fs::cache_dir() + "/runs/" + object_root_key(ckpt_dir);
}

std::string Checkpointer::local_tier_dir(const RunConfig& config, const std::string& ckpt_dir) {
  const std::string root = local_tier_root(config, ckpt_dir);
  if (root.empty()) return "";
  if (is_object_root(ckpt_dir)) return (stdfs::path(root) / object_root_key(ckpt_dir)).string();
  std::error_code ec;
  // Through symlinks: one --ckpt reached by two paths keeps one local tier.
  stdfs::path ckpt = stdfs::weakly_canonical(stdfs::absolute(ckpt_dir, ec), ec);
  if (ec) ckpt = stdfs::absolute(ckpt_dir, ec).lexically_normal();
  if (ckpt.filename().empty()) ckpt = ckpt.parent_path();
  const std::string key = ckpt.filename().string() + "-" + xxh3_hex(ckpt.string()).substr(0, 8);
  return (stdfs::path(root) / key).string();
}

Checkpointer::Checkpointer(const RunConfig& config, CheckpointOptions options, Reporter& reporter,
                           Collectives* comm)
    : config_(config),
      options_(std::move(options)),
      reporter_(reporter),
      comm_(comm),
      rank_(comm ? comm->rank() : 0),
      store_(options_.ckpt_dir, config.checkpoint.keep_last),
      local_(local_tier_root(config, options_.ckpt_dir).empty()
                 ? nullptr
                 : std::make_unique<CheckpointStore>(local_tier_dir(config, options_.ckpt_dir),
                                                     config.checkpoint.local_keep_last)),
      copy_(std::make_unique<HostStateCopy>()),
      writer_(local_ ? *local_ : store_, config.checkpoint.async) {
  const double every = config.checkpoint.every_minutes;
  interval_seconds_ = std::isnan(every) ? 0 : every * 60;
  // The best are kept in both tiers: on the local disk too, so that a best checkpoint is not
  // pruned there before its copy to --ckpt is made (local_keep_last + k folders at most).
  store_.set_keep_best(config.checkpoint.keep_best);
  if (local_) local_->set_keep_best(config.checkpoint.keep_best);
  if (local_ && rank_ == 0) {
    auto network =
        std::make_unique<CheckpointStore>(options_.ckpt_dir, config.checkpoint.keep_last);
    network->set_keep_best(config.checkpoint.keep_best);
    copier_ = std::make_unique<TierCopier>(std::move(network), *local_);
    local_->set_write_hook(copier_->hold_function());
  }
}

Checkpointer::~Checkpointer() {
  // The lease covers every write: the network copy (which gives up after 1 s) and the write in
  // flight end first. Its storage may hang; the release then waits kLeaseReleaseSeconds.
  copier_.reset();
  try {
    writer_.wait();
  } catch (const std::exception& e) {
    spdlog::warn("{}", e.what());
  }
  // A heartbeat stuck in storage that does not answer still uses its Lease: it stays
  // allocated until the process exits.
  if (lease_ && !lease_->release(kLeaseReleaseSeconds)) (void)lease_.release();
}

void Checkpointer::check_writable(const std::string& dir, const std::string& what) {
  open_storage(dir)->check_writable(what);
}

void Checkpointer::claim_directory() {
  if (rank_ != 0) return;
  store_.storage()->check_writable("--ckpt");
  try {
    if (options_.no_lease) {
      spdlog::warn(
          "--no-lease: writing checkpoints into {} without its lease; nothing keeps a "
          "second run from writing there too",
          options_.ckpt_dir);
    } else if (const std::string problem = store_.storage()->lease_problem(); !problem.empty()) {
      throw ConfigError("cannot hold the lease of " + options_.ckpt_dir + ": " + problem +
                        ", so two runs could both believe they hold it; this run does not "
                        "start. Use a server that enforces them, or --no-lease where no other "
                        "run can write there");
    } else {
      lease_ = Lease::acquire(store_.storage(), config_.checkpoint.lease_timeout, options_.force);
    }
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
  if (std::isnan(config_.checkpoint.every_minutes)) choose_interval(0);
  if (!local_) return;
  check_writable(local_->dir(), "checkpoint.local_dir");
  local_->clean_temporaries();
  if (!options_.resume && local_->has_checkpoints())
    throw ConfigError("the local tier " + local_->dir() +
                      " holds checkpoints of an earlier run with --ckpt " + options_.ckpt_dir +
                      " (" + local_->list(false).back().name +
                      "); continue them with --resume, or remove that folder to start fresh");
}

std::optional<CheckpointInfo> Checkpointer::newest_saved() const {
  std::optional<CheckpointInfo> newest;
  for (const CheckpointStore* store : std::vector<const CheckpointStore*>{&store_, local_.get()}) {
    if (!store) continue;
    const std::vector<CheckpointInfo> infos = store->list(/*verify=*/false);
    const CheckpointInfo* info = CheckpointView::newest_complete(infos);
    if (info && (!newest || info->global_step > newest->global_step)) newest = *info;
  }
  return newest;
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
  return interval_seconds_ > 0 && seconds_since(last_save_time_) >= interval_seconds_;
}

void Checkpointer::choose_interval(double write_seconds) {
  const double mtbf = config_.checkpoint.mtbf_hours * 3600;
  double cost = kAssumedSaveSeconds;
  std::string source = "assumed until a save is measured";
  if (!measured_stalls_.empty()) {
    std::vector<double> sorted = measured_stalls_;
    std::sort(sorted.begin(), sorted.end());
    cost = std::max(sorted[sorted.size() / 2], 1e-3);
    source = "median of " + std::to_string(sorted.size()) + " measured stalls";
  }
  double interval = young_daly_seconds(cost, mtbf);
  // The write runs beside training: saving more often than it takes would only queue saves
  // (each waiting for the last, which counts as stall).
  std::string floor;
  if (interval < 2 * write_seconds) {
    interval = 2 * write_seconds;
    floor = fmt::format("; raised to twice the {:.2f} s background write", write_seconds);
  }
  const double before = interval_seconds_;
  interval_seconds_ = interval;
  if (before > 0 && std::abs(interval - before) <= 0.25 * before) return;
  spdlog::info(
      "checkpoint.every_minutes auto: a save every {} = sqrt(2 x {:.3f} s save cost ({}) x "
      "{:.3g} h MTBF (checkpoint.mtbf_hours)){}",
      interval < 120 ? fmt::format("{:.2f} s", interval) : fmt::format("{:.1f} min", interval / 60),
      cost, source, config_.checkpoint.mtbf_hours, floor);
  reporter_.event("checkpoint_interval", {{"seconds", interval},
                                          {"save_cost_seconds", cost},
                                          {"mtbf_seconds", mtbf},
                                          {"measured_saves", measured_stalls_.size()},
                                          {"write_seconds", write_seconds}});
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
    {
      // The network copy pauses for the stall: on a machine with few cores it would slow it.
      const Bracket hold(copier_ ? copier_->hold_function() : nullptr);
      copy_->copy(model, optimizer, trainer_rng_states(model, rank_rng));
    }
    CheckpointSnapshot snapshot;
    snapshot.meta = std::move(meta);
    // `gpurun ckpt list DIR` finds the local tier through it.
    if (local_) snapshot.meta.extra["local_tier"] = local_->dir();
    writer_.submit(std::move(snapshot),
                   [copy = copy_.get()](CheckpointSnapshot& s) { copy->build(s); });
    if (write_before_training_) writer_.wait();
    stalls_[step] = seconds_since(stall_start);
  }
  last_saved_step_ = step;
  last_save_time_ = Clock::now();
  report_finished();
}

void Checkpointer::keep_host_buffers(bool keep) {
  writer_.wait();
  copy_->keep_buffers(keep);
}

void Checkpointer::report_finished() {
  for (WriteOutcome& o : writer_.finished()) {
    const int64_t step = o.meta.global_step;
    const double stall = stalls_[step];
    stalls_.erase(step);
    if (!o.result) {
      ++failed_saves_;
      last_error_ = o.error;
      const bool final_save = o.meta.epoch >= config_.train.epochs && o.meta.position_in_epoch == 0;
      const bool last_straw = failed_saves_ >= config_.checkpoint.max_failures;
      // Whether training goes on after it, for the event's readers (a notice says so).
      reporter_.event("checkpoint_failed", {{"global_step", step},
                                            {"error", o.error},
                                            {"errno", o.error_number},
                                            {"failures_in_a_row", failed_saves_},
                                            {"max_failures", config_.checkpoint.max_failures},
                                            {"final", final_save},
                                            {"stops", final_save || last_straw}});
      reporter_.end_progress();
      // The last epoch's save: no training goes on after it; finish() says what is lost.
      if (final_save) {
        spdlog::error("checkpoint of global step {} failed: {}", step, o.error);
        continue;
      }
      spdlog::error(
          "checkpoint of global step {} failed: {}; the last complete checkpoint "
          "({}) is untouched; {} ({} of {} failures in a row)",
          step, o.error,
          last_checkpoint_.empty() ? "none"
          : last_network_checkpoint_.empty()
              ? last_checkpoint_
              : last_checkpoint_ + ", copied to " + last_network_checkpoint_,
          last_straw ? "that is checkpoint.max_failures"
                     : "training goes on and saves again at the next checkpoint",
          failed_saves_, config_.checkpoint.max_failures);
      if (last_straw)
        throw Error("stopping: " + std::to_string(failed_saves_) +
                    " checkpoints in a row failed; last error: " + o.error + "; " +
                    not_saved(last_saved_step_));
      continue;
    }
    failed_saves_ = 0;
    const SaveResult& r = *o.result;
    last_checkpoint_ = r.path;
    last_network_checkpoint_.clear();  // until its copy is done
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
    if (std::isnan(config_.checkpoint.every_minutes)) {
      measured_stalls_.push_back(stall);
      choose_interval(config_.checkpoint.async ? o.build_seconds + r.write_seconds : 0);
    }
    nlohmann::json fields = {{"last_checkpoint", r.path}};
    // `gpurun ckpt list DIR` finds the local tier through it while DIR holds no checkpoint.
    if (local_) fields["local_tier"] = local_->dir();
    reporter_.status(fields, true);
    if (copier_) copier_->offer(r.path, step);
  }
  report_copies();
  check_lease();
}

void Checkpointer::report_copies() {
  if (!copier_) return;
  for (TierCopier::Outcome& o : copier_->finished()) {
    if (o.result) {
      if (copy_failures_ > 0)
        spdlog::info("the network tier {} caught up after {} failed copies: {} is complete there",
                     options_.ckpt_dir, copy_failures_, o.result->path);
      copy_failures_ = 0;
      reporter_.event("checkpoint_copied", {{"path", o.result->path},
                                            {"source", o.source},
                                            {"global_step", o.global_step},
                                            {"bytes", o.result->bytes},
                                            {"write_seconds", o.result->write_seconds}});
      reporter_.status({{"last_network_checkpoint", o.result->path}}, true);
      if (o.global_step == last_complete_step_) last_network_checkpoint_ = o.result->path;
      continue;
    }
    copy_failures_ = o.failures_in_a_row;
    last_copy_error_ = o.error;
    reporter_.event("checkpoint_copy_failed", {{"global_step", o.global_step},
                                               {"source", o.source},
                                               {"error", o.error},
                                               {"errno", o.error_number},
                                               {"failures_in_a_row", o.failures_in_a_row},
                                               {"retry_in_seconds", o.retry_in_seconds}});
    reporter_.end_progress();
    spdlog::warn(
        "copy of checkpoint {} to the network tier {} failed ({} in a row): {}; training goes "
        "on, the local tier holds it; retrying in {:.0f} s with the newest checkpoint then",
        o.source, options_.ckpt_dir, o.failures_in_a_row, o.error, o.retry_in_seconds);
  }
}

bool Checkpointer::network_holds(int64_t global_step) const {
  if (copier_->copied_step() >= global_step) return true;
  const std::optional<int64_t> newest = network_newest_step(store_.dir());
  return newest && *newest >= global_step;
}

bool Checkpointer::settle_tiers(double seconds) {
  if (!copier_) return true;
  if (last_complete_step_ <= 0) return false;
  const std::string name = checkpoint_folder::name_of(last_checkpoint_);
  // The copier's word, not a listing: the grace is for the copy, and storage that hangs would
  // take it all.
  bool copied = copier_->copied_step() >= last_complete_step_;
  if (!copied) {
    spdlog::info("giving the network copy of {} up to {:.0f} s", name, std::max(seconds, 0.0));
    copied = seconds > 0 &&
             copier_->wait_for(last_complete_step_, config_.checkpoint.max_failures, seconds);
  }
  report_copies();
  local_->retain();
  if (copied) {
    spdlog::info("checkpoint {} is complete in both tiers: {} and {}", name, last_checkpoint_,
                 (stdfs::path(store_.dir()) / name).string());
    return true;
  }
  const std::optional<int64_t> network = network_newest_step(store_.dir());
  spdlog::warn(
      "checkpoint {} is complete in the local tier only ({}); a restart on this machine resumes "
      "from it, another machine from {}",
      name, last_checkpoint_,
      !network ? "the network tier's newest checkpoint (" + store_.dir() +
                     " cannot be listed: it does not answer or fails)"
      : *network < 0 ? std::string("nothing (the network tier holds no checkpoint)")
                     : "global step " + std::to_string(*network) + " of the network tier");
  return false;
}

void Checkpointer::drain() {
  writer_.wait();
  report_finished();
}

void Checkpointer::finish(int64_t global_step) {
  drain();
  bool complete = rank_ != 0 || last_complete_step_ == global_step;
  bool copied = true;
  if (complete && copier_) {
    // A stop signal, or a lease lost or expired meanwhile, ends the wait: the final state is
    // safe in the local tier, and --ckpt may no longer be this run's to write.
    const auto give_up = [this] {
      return stop_signal() != 0 || (lease_ && (lease_->lost() || lease_->expired()));
    };
    copied = network_holds(global_step) ||
             copier_->wait_for(global_step, config_.checkpoint.max_failures, 0, give_up);
    report_copies();
    if (!copied && stop_signal() != 0) {
      spdlog::warn(
          "received signal {} while the final checkpoint was being copied; it is "
          "complete in the local tier ({}); run again with --resume on this machine "
          "to copy it to {}",
          stop_signal(), last_checkpoint_, options_.ckpt_dir);
      throw Stopped(stop_signal());
    }
    check_lease();
    local_->retain();  // what local retention spared while it was being copied
    complete = copied;
  }
  if (comm_) complete = comm_->all_reduce({complete ? 0.0 : 1.0}, Collectives::Op::kMax)[0] == 0;
  if (complete) return;
  if (rank_ != 0)
    throw Error("rank 0 could not write the final checkpoint (global step " +
                std::to_string(global_step) + "); its log says why");
  if (!copied)
    throw Error("the final checkpoint (global step " + std::to_string(global_step) +
                ") is complete in the local tier (" + last_checkpoint_ +
                ") but could not be copied to the network tier " + options_.ckpt_dir + " (" +
                std::to_string(config_.checkpoint.max_failures) + " attempts failed; last error: " +
                last_copy_error_ + "); `gpurun --resume` on this machine copies it again");
  throw Error("the final checkpoint (global step " + std::to_string(global_step) +
              ") was not written" + (last_error_.empty() ? "" : ": " + last_error_) + "; " +
              not_saved(global_step) + "; the trained model is not saved");
}

}  // namespace gpurun

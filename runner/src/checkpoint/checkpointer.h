// The trainer's side of checkpointing: the directory's lease and rules, the choice of the
// checkpoint to resume, when a save is due, what a save holds (every rank's RNG state gathered
// to rank 0), and the reports of background writes. Rank 0 alone touches the directory; the
// other ranks take part in the collectives only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/async_writer.h"
#include "checkpoint/format/pickle.h"  // NamedTensors
#include "checkpoint/storage/store.h"
#include "gpurun/config.h"

namespace torch {
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace gpurun {

class Collectives;
class FlatOptimizer;
class HostShardCopy;
class HostStateCopy;
class StepOptimizer;
class Lease;
class Reporter;
class TierCopier;

/// What the command line says about the checkpoint directory (RunOptions' share of it).
struct CheckpointOptions {
  std::string ckpt_dir;  ///< the checkpoint root (--ckpt)
  bool resume = false;   ///< --resume: continue from the newest complete checkpoint, if any
  bool force = false;    ///< --force: take the directory's lease at once, even from a live run
  /// --no-lease: write without the lease, where the storage cannot hold one (an S3 server that
  /// ignores conditional writes); the user vouches that no other run writes there.
  bool no_lease = false;
};

class Checkpointer {
 public:
  /// `comm` is null for a single process.
  Checkpointer(const RunConfig& config, CheckpointOptions options, Reporter& reporter,
               Collectives* comm);
  /// Releases the lease once the network copy and the write in flight have ended, waiting
  /// at most kLeaseReleaseSeconds for its storage.
  ~Checkpointer();

  /// How long the end of a run waits for the lease's storage to remove lease.json.
  static constexpr double kLeaseReleaseSeconds = 1.0;

  /// Creates `dir` when missing, then creates, writes (with fsync) and removes a file in it:
  /// the only proof that checkpoints can be written there (root ignores permission bits).
  /// Throws ConfigError naming the cause (read-only or full file system, no permission).
  /// `what` names the directory in the message ("--ckpt", "checkpoint.local_dir").
  static void check_writable(const std::string& dir, const std::string& what = "--ckpt");

  /// Where metrics.jsonl and status.json go without --run-dir: the checkpoint directory, or for
  /// an s3:// root a folder of this machine named after it,
  /// $XDG_CACHE_HOME/gpurun/runs/<last prefix component>-<8 hex digits of xxh3(URL)>.
  static std::string default_run_dir(const std::string& ckpt_dir);

  /// checkpoint.local_dir's word for "no local tier" (an s3:// root has one by default).
  static constexpr const char* kNoLocalTier = "none";

  /// Where the local tiers of this machine go: checkpoint.local_dir; for an s3:// --ckpt
  /// without it, $XDG_CACHE_HOME/gpurun/tiers (default ~/.cache/gpurun/tiers); "" for none.
  static std::string local_tier_root(const RunConfig& config, const std::string& ckpt_dir);

  /// The local tier of a run (local_tier_root() set, else ""): a folder of it named
  /// after --ckpt, LOCAL_DIR/<basename of DIR>-<8 hex digits of xxh3(absolute DIR)>, so that
  /// runs sharing one local disk never share a tier, and a restart on the same machine finds
  /// its own.
  static std::string local_tier_dir(const RunConfig& config, const std::string& ckpt_dir);

  /// Rank 0: check_writable(DIR), then holds DIR/lease.json for the whole run, cleans
  /// leftover temporaries and refuses a directory that holds checkpoints unless resuming.
  /// Throws ConfigError, naming the cause: DIR cannot be created or written (read-only or
  /// full file system, no permission), the lease cannot be written (without it two machines
  /// could write one run), DIR is held by a live run, or it holds checkpoints without --resume.
  void claim_directory();

  /// The checkpoint to resume from: rank 0 picks the newest complete one (falling back past
  /// damaged ones) and tells the others its name, so that no rank ever opens a checkpoint
  /// that is still being written and all resume the same step (docs/architecture.md, case 13).
  /// A single process checks the files' sizes here and their checksums as restore_state()
  /// reads them (see fall_back()); in a distributed run rank 0 verifies the checksums here.
  /// With a local tier the newest of both tiers wins (the local one on a tie: it reads faster).
  /// nullopt without --resume or when there is none. Throws ResumeError when every checkpoint
  /// is damaged.
  std::optional<LoadedCheckpoint> choose();

  /// After restore_state() found `damaged` damaged (`problem`, the DamagedCheckpointError's
  /// message): sets it aside in its tier and returns choose()'s next pick. Throws as choose()
  /// does, ResumeError when it cannot be set aside, and DamagedCheckpointError in a
  /// distributed run (all ranks hold the one rank 0 verified: it was damaged since).
  std::optional<LoadedCheckpoint> fall_back(const LoadedCheckpoint& damaged,
                                            const std::string& problem);

  /// Records that training resumed from `path` at `global_step`; with a local tier, a
  /// network tier that lags behind it is brought up to date in the background.
  void resumed_from(const std::string& path, int64_t global_step);

  /// The save interval has passed since the last save (on this rank's clock):
  /// checkpoint.every_minutes, or with `auto` the Young/Daly interval (interval.h), chosen
  /// with an assumed save cost at the start and again from the measured stalls.
  bool minutes_due() const;

  /// Whether the state after `global_step` is saved already.
  bool saved(int64_t global_step) const { return last_saved_step_ == global_step; }

  /// Saves `model` and `optimizer` with `meta` (model digest, threads and CPU capability are
  /// filled in): every rank passes its RNG state to rank 0, which waits for the write in
  /// flight, copies the state to host memory (HostStateCopy: the stall is that copy) and
  /// hands the rest (digest, serialization, files) to the background writer. Collective with
  /// several ranks. Throws as report_finished() does when the lease was lost or expired
  /// (nothing is saved).
  void save(CheckpointMeta meta, const torch::nn::Module& model,
            torch::optim::Optimizer& optimizer);

  /// save() of a StepOptimizer (optim/step_optimizer.h): a replicated one as above (optim.pt);
  /// a flat one as a sharded checkpoint (docs/architecture.md, "Checkpoint saves"), collective
  /// on every rank: each rank copies its slice of the optimizer state to host memory and
  /// writes and fsyncs its shard file into a temporary folder rank 0 names (the shard writes
  /// are synchronous, on the training thread: each rank writes 1/N of the state); rank 0
  /// gathers their sizes and xxh3 and hands model.pt, trainer.pt and the manifest, written
  /// last, to the background writer, which renames the folder and replaces LATEST. A rank
  /// that fails to write its shard fails the save on every rank alike (a checkpoint_failed
  /// event; training goes on). Defined in sharded_save.cpp.
  void save(CheckpointMeta meta, const torch::nn::Module& model, StepOptimizer& optimizer);

  /// Whether a CPU run's host copy of the state stays from save to save (the memory plan's
  /// MeasuredPeaks::checkpoint_buffers); waits for the write in flight, which reads it.
  void keep_host_buffers(bool keep);

  /// Whether a save waits for its background write before training goes on: a CPU run whose
  /// copy of the state does not fit in memory beside a training step (the memory plan's
  /// MeasuredPeaks::checkpoint_copy without checkpoint_buffers) must not train while the write
  /// still holds the copy. The stall then includes the write.
  void write_before_training(bool wait) { write_before_training_ = wait; }

  /// Reports the background writes that finished: a `checkpoint` event for each success; for
  /// a failure an error that keeps training going (the last complete checkpoint is untouched)
  /// until checkpoint.max_failures saves in a row have failed, then throws Error. Then, on
  /// rank 0, checks the lease (the trainer calls this after every step, so a run stops at its
  /// next step): throws ConfigError (exit 2) when another run took the lease, Error (exit 1)
  /// when it expired; nothing more is saved, and the message says what happened and which
  /// steps are not saved.
  void report_finished();

  /// Waits for the write in flight and reports it.
  void drain();

  /// After a stop signal, with a local tier: gives the network copy of the newest checkpoint
  /// at most `seconds` to finish, then logs which tiers hold it. Returns whether the network
  /// tier holds it: true without a local tier (the network tier is the only one), false with
  /// one when nothing was saved yet.
  bool settle_tiers(double seconds);

  /// The checkpoint roots of this run: --ckpt, then the local tier when there is one.
  std::vector<std::string> tier_dirs() const;

  /// The newest complete checkpoint of any tier, by its manifest and its files' sizes (quick,
  /// no checksums: these are this run's own); nullopt when there is none. Throws IoError when a
  /// tier cannot be read.
  std::optional<CheckpointInfo> newest_saved() const;

  /// The end of a run that trained up to `global_step`: drains, then makes sure that the
  /// state after `global_step` is in a complete checkpoint, in the network tier too when
  /// there is a local one (the copy is retried up to checkpoint.max_failures times). Otherwise
  /// throws Error on every rank (collective with several ranks), rank 0's saying why the final
  /// checkpoint was not written, which steps are not saved and where the newest complete checkpoint
  /// is, if any.
  void finish(int64_t global_step);

  const std::string& last_checkpoint() const { return last_checkpoint_; }
  /// The global step of last_checkpoint(), the newest complete one (0: none yet).
  int64_t last_complete_step() const { return last_complete_step_; }

  /// CheckpointStore::hold_commits(): no checkpoint becomes complete while the lock is held.
  /// The store saves go to: the local tier when there is one.
  std::unique_lock<std::timed_mutex> hold_commits(double seconds) {
    return (local_ ? *local_ : store_).hold_commits(seconds);
  }

  /// For messages: which steps up to `reached` (unknown: nullopt) no complete checkpoint
  /// holds and where the newest complete checkpoint is ("global step N is saved in PATH"
  /// when it holds `reached`).
  std::string not_saved(std::optional<int64_t> reached) const;

 private:
  using Clock = std::chrono::steady_clock;
  const RunConfig& config_;
  const CheckpointOptions options_;
  Reporter& reporter_;
  Collectives* comm_;
  const int rank_;
  CheckpointStore store_;                   ///< --ckpt: the network tier
  std::unique_ptr<CheckpointStore> local_;  ///< checkpoint.local_dir's tier, or null
  std::unique_ptr<Lease> lease_;  ///< released after the last write (declared before writer_)
  std::unique_ptr<HostStateCopy> copy_;  ///< read by the write in flight (before writer_)
  CheckpointWriter writer_;              ///< writes to local_ when set, else to store_
  std::unique_ptr<TierCopier> copier_;   ///< local_ to the network tier, or null
  std::map<int64_t, double> stalls_;     ///< global step -> stall of its save, until reported
  void check_lease() const;
  /// The flat case of save(StepOptimizer&) (sharded_save.cpp).
  void save_sharded(CheckpointMeta meta, const torch::nn::Module& model, FlatOptimizer& flat);
  /// Every rank's random state, on rank 0 (the others: empty). Collective.
  std::vector<NamedTensors> gather_rank_rng(const torch::nn::Module& model);
  /// This rank's shard copy, reused from save to save (shared_ptr: a complete type where made).
  std::shared_ptr<HostShardCopy> shard_copy_;
  std::optional<LoadedCheckpoint> load_newest_of_tiers(bool verify);
  /// Copies the newest checkpoint of a bucket --ckpt newer than `local_step` into `into` (the
  /// local tier) (CheckpointStore::copy_from(): verified as it arrives), setting aside those that
  /// fail.
  void fetch_from_network(CheckpointStore& into, int64_t local_step);
  /// Where a resume from a bucket without a local tier fetches its checkpoint, or null.
  std::unique_ptr<CheckpointStore> staging_;
  /// Whether the checkpoint folder `path` is one of the local tier's.
  bool in_local_tier(const std::string& path) const;
  void report_copies();
  /// Whether --ckpt holds `global_step` or a later one: copied by this run, or found there.
  bool network_holds(int64_t global_step) const;
  /// checkpoint.every_minutes auto: chooses interval_seconds_ again with the stalls measured so
  /// far and the background write time `write_seconds`; logs and reports a change.
  void choose_interval(double write_seconds);

  int64_t failed_saves_ = 0;
  bool warned_grace_ = false;
  bool write_before_training_ = false;
  int64_t last_saved_step_ = 0;          // step 0 needs no checkpoint: resuming from none is fresh
  int64_t last_complete_step_ = 0;       ///< global step of last_checkpoint_ (0: none needed yet)
  std::string last_error_;               ///< of the last failed write
  std::string last_copy_error_;          ///< of the last failed copy to the network tier
  std::string last_network_checkpoint_;  ///< the copy of last_checkpoint_ in --ckpt, once done
  int64_t copy_failures_ = 0;            ///< failed copies to the network tier in a row
  std::string last_checkpoint_;
  Clock::time_point last_save_time_ = Clock::now();
  double interval_seconds_ = 0;          ///< time-based saves; 0: off
  std::vector<double> measured_stalls_;  ///< with every_minutes auto
};

}  // namespace gpurun

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

#include "checkpoint/store.h"
#include "checkpoint/async_writer.h"
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
class Lease;
class Reporter;

/// What the command line says about the checkpoint directory (RunOptions' share of it).
struct CheckpointOptions {
  std::string ckpt_dir;  ///< the checkpoint root (--ckpt)
  bool resume = false;   ///< --resume: continue from the newest complete checkpoint, if any
  bool force = false;    ///< --force: take the directory's lease at once, even from a live run
};

class Checkpointer {
 public:
  /// `comm` is null for a single process.
  Checkpointer(const RunConfig& config, CheckpointOptions options, Reporter& reporter,
               Collectives* comm);
  ~Checkpointer();

  /// Rank 0: holds DIR/lease.json for the whole run (a target where it cannot be written is
  /// reported and training goes on: its saves fail the same way), cleans leftover temporaries
  /// and refuses a directory that holds checkpoints unless resuming. Throws ConfigError
  /// (directory held by a live run, or holding checkpoints without --resume).
  void claim_directory();

  /// The checkpoint to resume from: rank 0 picks the newest complete one (falling back past
  /// damaged ones) and tells the others its name, so that no rank ever opens a checkpoint
  /// that is still being written and all resume the same step (cases.md 13). nullopt without
  /// --resume or when there is none. Throws ResumeError when every checkpoint is damaged.
  std::optional<LoadedCheckpoint> choose();

  /// Records that training resumed from `path` at `global_step`.
  void resumed_from(const std::string& path, int64_t global_step);

  /// checkpoint.every_minutes has passed since the last save (on this rank's clock).
  bool minutes_due() const;

  /// Whether the state after `global_step` is saved already.
  bool saved(int64_t global_step) const { return last_saved_step_ == global_step; }

  /// Saves `model` and `optimizer` with `meta` (model digest, threads and CPU capability are
  /// filled in): every rank passes its RNG state to rank 0, which copies the state to host
  /// memory and hands it to the background writer. Collective with several ranks. Throws
  /// ConfigError when another run took over the lease (nothing is saved).
  void save(CheckpointMeta meta, const torch::nn::Module& model, torch::optim::Optimizer& optimizer);

  /// Reports the background writes that finished: a `checkpoint` event for each success; for
  /// a failure an error that keeps training going (the last complete checkpoint is untouched)
  /// until checkpoint.max_failures saves in a row have failed, then throws Error.
  void report_finished();

  /// Waits for the write in flight and reports it.
  void drain();

  const std::string& last_checkpoint() const { return last_checkpoint_; }

 private:
  using Clock = std::chrono::steady_clock;
  const RunConfig& config_;
  const CheckpointOptions options_;
  Reporter& reporter_;
  Collectives* comm_;
  const int rank_;
  CheckpointStore store_;
  std::unique_ptr<Lease> lease_;  ///< released after the last write (declared before writer_)
  CheckpointWriter writer_;
  std::map<int64_t, double> stalls_;  ///< global step -> stall of its save, until reported
  int64_t failed_saves_ = 0;
  bool warned_grace_ = false;
  int64_t last_saved_step_ = 0;  // step 0 needs no checkpoint: resuming from none is fresh
  std::string last_checkpoint_;
  Clock::time_point last_save_time_ = Clock::now();
};

}  // namespace gpurun

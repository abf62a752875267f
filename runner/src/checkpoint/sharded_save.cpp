// Checkpointer::save() of a StepOptimizer (checkpointer.h): the replicated case goes to the
// unsharded save, the flat one is the sharded save's protocol across the ranks
// (docs/architecture.md, "Checkpoint saves"). Apart from checkpointer.cpp because it is the one
// part of the trainer's checkpointing that every rank writes files for.
#include <spdlog/spdlog.h>

#include "checkpoint/checkpointer.h"
#include "checkpoint/format/shard_files.h"
#include "checkpoint/format/state_copy.h"
#include "checkpoint/storage/lease.h"
#include "checkpoint/tier_copy.h"
#include "distributed/collectives.h"
#include "gpurun/errors.h"
#include "optim/flat_optimizer.h"
#include "optim/step_optimizer.h"
#include "util/bracket.h"
#include "util/clock.h"
#include "util/fs.h"

namespace gpurun {

using json = nlohmann::json;

std::vector<NamedTensors> Checkpointer::gather_rank_rng(const torch::nn::Module& model) {
  std::vector<NamedTensors> rank_rng;
  if (!comm_) return rank_rng;
  const std::vector<std::string> states =
      comm_->gather(pickle_tensors(process_rng_states(model_device(model))));
  for (size_t r = 1; r < states.size(); ++r)
    rank_rng.push_back(
        unpickle_tensors(states[r], "rank " + std::to_string(r) + "'s random state"));
  return rank_rng;
}

void Checkpointer::save(CheckpointMeta meta, const torch::nn::Module& model,
                        StepOptimizer& optimizer) {
  if (torch::optim::Optimizer* replicated = optimizer.replicated())
    return save(std::move(meta), model, *replicated);
  save_sharded(std::move(meta), model, *optimizer.flat());
}

void Checkpointer::save_sharded(CheckpointMeta meta, const torch::nn::Module& model,
                                FlatOptimizer& flat) {
  const int64_t step = meta.global_step;
  const std::vector<NamedTensors> rank_rng = gather_rank_rng(model);
  CheckpointStore& target = local_ ? *local_ : store_;
  const auto stall_start = Clock::now();
  std::string folder, error;
  if (rank_ == 0) {
    if (lease_) lease_->still_ours();
    check_lease();
    writer_.wait();  // its build reads the host copy
    const Bracket hold(copier_ ? copier_->hold_function() : nullptr);
    copy_->copy(model, trainer_rng_states(model, rank_rng));
    try {
      folder = target.shard_folder(checkpoint_name(meta.epoch, step));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!shard_copy_) shard_copy_ = std::make_shared<HostShardCopy>();
  ShardFileEntry mine;
  {
    const Bracket hold(copier_ ? copier_->hold_function() : nullptr);
    shard_copy_->copy(flat, config_.optim.name);
    // Rank 0 names the folder (or says that it could not make one); every rank writes there.
    if (comm_) {
      const json told =
          json::parse(comm_->broadcast(json{{"folder", folder}, {"error", error}}.dump()));
      folder = told.value("folder", "");
      error = told.value("error", "");
    }
    if (!folder.empty()) {
      try {
        mine = shard_copy_->write(folder);
      } catch (const IoError& e) {
        mine.error = e.what();
        mine.error_number = e.error_number();
      } catch (const std::exception& e) {
        mine.error = e.what();
      }
    }
    // A CPU run's host memory is its device memory, and the plan does not count this copy.
    if (flat.parameter_buffer().is_cpu()) shard_copy_->release();
  }
  std::vector<ShardFileEntry> entries{mine};
  if (comm_) {
    const std::vector<std::string> all = comm_->gather(mine.to_json().dump());
    entries.clear();
    for (const std::string& text : all)
      entries.push_back(ShardFileEntry::from_json(json::parse(text)));
  }
  if (rank_ == 0) {
    CheckpointSnapshot snapshot;
    snapshot.meta = std::move(meta);
    if (local_) snapshot.meta.extra["local_tier"] = local_->dir();
    for (size_t r = 0; r < entries.size() && error.empty(); ++r) {
      if (!entries[r].error.empty()) {
        error = "rank " + std::to_string(r) + " could not write its shard: " + entries[r].error;
      }
    }
    if (error.empty()) {
      snapshot.meta.sharded_optimizer = shard_copy_->index().to_json();
      snapshot.shard_folder = folder;
      for (const ShardFileEntry& e : entries)
        snapshot.shard_files[e.name] = {{"bytes", e.bytes}, {"xxh3", e.xxh3}};
      writer_.submit(std::move(snapshot),
                     [copy = copy_.get()](CheckpointSnapshot& s) { copy->build(s); });
    } else {
      // The save fails on every rank alike: reported as any failed write, training goes on.
      try {
        if (!folder.empty()) fs::remove_all(folder);
      } catch (const std::exception& e) {
        spdlog::warn("could not remove the shards of a failed save: {}", e.what());
      }
      writer_.submit(std::move(snapshot), [error](CheckpointSnapshot&) { throw Error(error); });
    }
    if (write_before_training_) writer_.wait();
    stalls_[step] = seconds_since(stall_start);
  }
  last_saved_step_ = step;
  last_save_time_ = Clock::now();
  report_finished();
}

}  // namespace gpurun

// The resume side of Checkpointer: which checkpoint a run starts from, across the local and
// the network tier, and what happens when the one chosen turns out damaged while it loads.
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpointer.h"
#include "checkpoint/format/folder.h"
#include "checkpoint/tier_copy.h"
#include "distributed/collectives.h"
#include "gpurun/errors.h"
#include "util/fs.h"

namespace gpurun {

namespace stdfs = std::filesystem;

std::vector<std::string> Checkpointer::tier_dirs() const {
  std::vector<std::string> dirs{store_.dir()};
  if (local_) dirs.push_back(local_->dir());
  return dirs;
}

void Checkpointer::fetch_from_network(CheckpointStore& into, int64_t local_step) {
  // Newest first, as load_latest() takes them: a checkpoint whose bytes do not match its
  // manifest as they arrive is set aside in the bucket, and the previous one fetched.
  const std::vector<CheckpointInfo> infos = store_.list(/*verify=*/false);
  for (auto it = infos.rbegin(); it != infos.rend() && it->global_step > local_step; ++it) {
    std::string problem = it->problem;
    if (problem.empty()) {
      try {
        spdlog::info("fetching {} into {}", it->path, into.dir());
        const SaveResult fetched = into.copy_from(*store_.storage(), it->name);
        spdlog::info("fetched {} ({} bytes in {:.1f} s)", it->name, fetched.bytes,
                     fetched.write_seconds);
        return;
      } catch (const ResumeError& e) {
        problem = e.what();
      }
    }
    store_.set_aside_damaged(*it, problem);
  }
}

std::optional<LoadedCheckpoint> Checkpointer::load_newest_of_tiers(bool verify) {
  int64_t local_step = local_->view().newest_complete_step();
  // The loaders read a checkpoint's files in place: one in a bucket is brought to the local
  // disk first, its files verified as they arrive.
  if (!store_.storage()->is_local() && store_.view().newest_complete_step() > local_step) {
    fetch_from_network(*local_, local_step);
    local_step = local_->view().newest_complete_step();
  }
  const int64_t network_step = store_.view().newest_complete_step();
  // The newer tier first, the local one on a tie; the other only when the first falls back
  // (past damaged checkpoints, which each tier sets aside on its own) to an older step.
  CheckpointStore* order[2] = {local_.get(), &store_};
  int64_t steps[2] = {local_step, network_step};
  if (network_step > local_step) {
    std::swap(order[0], order[1]);
    std::swap(steps[0], steps[1]);
  }
  std::optional<LoadedCheckpoint> best;
  std::string errors;
  for (int i = 0; i < 2; ++i) {
    if (best && best->meta.global_step >= steps[i]) break;
    if (!order[i]->storage()->is_local()) continue;  // fetched above, or none newer
    try {
      std::optional<LoadedCheckpoint> loaded = order[i]->load_latest(verify);
      if (loaded && (!best || loaded->meta.global_step > best->meta.global_step))
        best = std::move(loaded);
    } catch (const ResumeError& e) {
      spdlog::warn("{}", e.what());
      errors += std::string(errors.empty() ? "" : "\n") + e.what();
    }
  }
  if (!best) {
    if (!errors.empty()) throw ResumeError(errors);
    return best;
  }
  const bool from_local = in_local_tier(best->info.path);
  const int64_t other = from_local ? network_step : local_step;
  spdlog::info("resuming from the {} tier: {} (the {} tier's newest: {})",
               from_local ? "local" : "network", best->info.path, from_local ? "network" : "local",
               other < 0 ? std::string("none") : "global step " + std::to_string(other));
  // A newer folder of the other tier that did not verify is left to that tier's retention;
  // say so, as a damaged checkpoint of the tier resumed from is.
  for (const CheckpointStore* tier : {local_.get(), &store_}) {
    for (const CheckpointInfo& info : tier->list(/*verify=*/false))
      if (!info.complete && info.global_step > best->meta.global_step)
        spdlog::warn("skipping {}, which does not verify ({})", info.path, info.problem);
  }
  return best;
}

std::optional<LoadedCheckpoint> Checkpointer::choose() {
  std::optional<LoadedCheckpoint> loaded;
  // A single process reads the checkpoint once, checking it as it loads, and falls back when
  // it is damaged (fall_back()). The ranks of a distributed run must all load the same one:
  // rank 0 verifies it before naming it.
  const bool verify = comm_ != nullptr;
  if (options_.resume && rank_ == 0) {
    if (local_) {
      loaded = load_newest_of_tiers(verify);
    } else if (!store_.storage()->is_local()) {
      // A bucket without a local tier (checkpoint.local_dir: none): its newest checkpoint is
      // still fetched to this machine's disk, where the loaders read it.
      staging_ = std::make_unique<CheckpointStore>(
          (stdfs::path(default_run_dir(options_.ckpt_dir)) / "resume").string(), 1);
      fetch_from_network(*staging_, staging_->view().newest_complete_step());
      loaded = staging_->load_latest(verify);
    } else {
      loaded = store_.load_latest(verify);
    }
  }
  if (!comm_) return loaded;
  const std::string path = comm_->broadcast(loaded ? loaded->info.path : "");
  if (rank_ != 0 && !path.empty()) {
    // Rank 0's local tier is on rank 0's machine; a rank on another one reads the network copy.
    const std::string network_copy =
        (stdfs::path(store_.dir()) / checkpoint_folder::name_of(path)).string();
    loaded = CheckpointStore::load(fs::exists(path) ? path : network_copy);
  }
  return loaded;
}

bool Checkpointer::in_local_tier(const std::string& path) const {
  return local_ && stdfs::path(path).parent_path() == stdfs::path(local_->dir());
}

std::optional<LoadedCheckpoint> Checkpointer::fall_back(const LoadedCheckpoint& damaged,
                                                        const std::string& problem) {
  if (comm_) throw DamagedCheckpointError(problem);  // verified by choose(): damaged since
  CheckpointStore& tier =
      in_local_tier(damaged.info.path) ? *local_
      : staging_ && stdfs::path(damaged.info.path).parent_path() == stdfs::path(staging_->dir())
          ? *staging_
          : store_;
  tier.set_aside_damaged(damaged.info, problem);
  return choose();
}

void Checkpointer::resumed_from(const std::string& path, int64_t global_step) {
  last_saved_step_ = last_complete_step_ = global_step;
  last_checkpoint_ = path;
  // A keep_last lowered for this run applies now, not after the first save: on a disk that
  // the old keep_last filled, that save could never succeed. The checkpoint resumed from stays
  // whatever its age. A resume from the network tier trims the local disk too (its first save
  // goes there); the network tier's own retention waits for the copier's next copy, so that
  // storage that hangs never holds up the start.
  if (rank_ != 0) return;
  const bool from_local = in_local_tier(path);
  if (!staging_) (from_local ? *local_ : store_).retain(checkpoint_folder::name_of(path));
  if (local_ && !from_local) local_->retain();
  // The network tier lags behind (it was down, or the copy was cut short): catch it up.
  if (from_local && store_.view().newest_complete_step() < global_step)
    copier_->offer(path, global_step);
}

}  // namespace gpurun

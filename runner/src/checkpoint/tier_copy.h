// The copy from the local tier (checkpoint.local_dir) to the network tier (--ckpt): every save
// is complete and verified on the local disk first, and this background thread then brings the
// newest one to the network tier with the store's protocol (CheckpointStore::copy_from:
// temporary folder, fsync, rename, LATEST last). Training never waits for it.
//
// A failed copy is retried with exponential backoff (1 s, 2 s, 4 s ... at most 60 s). Saves
// that complete meanwhile replace the one waiting: the network tier catches up with the newest
// checkpoint and never queues every missed one. Failures are counted here, apart from the
// local tier's checkpoint.max_failures: a network tier that is down never stops training.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/storage/store.h"

namespace gpurun {

class TierCopier {
 public:
  /// The outcome of one copy attempt.
  struct Outcome {
    std::string source;                ///< the local checkpoint folder
    int64_t global_step = 0;           ///< its step
    std::optional<SaveResult> result;  ///< set when it is complete in the network tier
    std::string error;                 ///< what failed otherwise
    int error_number = 0;              ///< its errno (0: not a storage error)
    int64_t failures_in_a_row = 0;     ///< this one included; 0 after a success
    double retry_in_seconds = 0;       ///< when the next attempt starts (failures only)
  };

  /// Copies into `network`, which the copier then owns (its thread may outlive a stop, see
  /// the destructor). `protect` is the local store: its retention spares the checkpoint being
  /// copied (CheckpointStore::set_retention_guard()).
  TierCopier(std::unique_ptr<CheckpointStore> network, CheckpointStore& protect);
  /// Stops taking new work, lets a copy in progress finish for at most 1 s, then leaves the
  /// thread to end on its own (a hung network file system cannot be interrupted): the process
  /// exits without waiting for it, and what it had not renamed is only a temporary folder.
  ~TierCopier();
  TierCopier(const TierCopier&) = delete;
  TierCopier& operator=(const TierCopier&) = delete;

  /// Asks for `folder` (a complete local checkpoint of `global_step`) to be copied. It
  /// replaces one still waiting; an older step than one already copied is ignored.
  void offer(const std::string& folder, int64_t global_step);

  /// Outcomes since the last call, oldest first.
  std::vector<Outcome> finished();

  /// While held, a copy in progress pauses between its 8 MiB chunks (at most 30 s at a time):
  /// the local tier holds it while a save writes its files, so that the network copy, best
  /// effort, never competes with the save that protects the run for a disk they share (the
  /// page cache's writeback, a local disk under both tiers), and the trainer holds it for a
  /// save's stall, so that the copy takes no core or memory bandwidth from the host copy. The
  /// function returned takes a hold (true) or gives one back (false), from any thread, and
  /// may outlive the copier; the copy pauses while any is taken.
  std::function<void(bool held)> hold_function() const;

  /// The newest global step complete in the network tier by this copier (-1: none yet).
  int64_t copied_step() const;

  /// Blocks until `global_step` (or a newer one) is complete in the network tier, retrying
  /// after at most 2 s rather than after the backoff; gives up after `max_failures` more
  /// failed attempts, after `seconds` (<= 0: no time limit), or when `give_up` (asked about
  /// once a second, without the copier's lock) returns true. Returns whether it is complete.
  bool wait_for(int64_t global_step, int64_t max_failures, double seconds,
                const std::function<bool()>& give_up = {});

 private:
  struct Shared;
  static void loop(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
};

}  // namespace gpurun

// Asynchronous checkpoint writes: the trainer copies its state to host memory at a step
// boundary (the stall) and a background thread builds the checkpoint from that copy (the
// digest, the files' sources) and streams the files to the (possibly slow, network) checkpoint
// directory, serializing them as they are written, while training goes on. At most one write
// is in flight: a new save first waits for the previous one, and that wait counts as stall.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "checkpoint/storage/store.h"

namespace gpurun {

/// The outcome of one background write.
struct WriteOutcome {
  CheckpointMeta meta;
  std::optional<SaveResult> result;  ///< set when the write succeeded
  std::string error;                 ///< what failed otherwise (IoError's message)
  int error_number = 0;              ///< its errno
  double build_seconds = 0;          ///< the Builder's time (the digest), before the write
  double queued_seconds = 0;         ///< from submit() to the end of the write
};

class CheckpointWriter {
 public:
  /// `async` false writes in submit() itself (same outcome reporting).
  CheckpointWriter(CheckpointStore& store, bool async);
  ~CheckpointWriter();  ///< waits for the write in flight
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Fills a snapshot's files (and meta fields computed from the state) on the writer
  /// thread, before the write; what it throws is that write's failure.
  using Builder = std::function<void(CheckpointSnapshot&)>;

  /// Hands `snapshot` to the writer, after waiting for a write in flight; `build`, when
  /// given, runs on the writer thread first (in submit() itself when not async). Returns the
  /// seconds spent waiting for the write in flight.
  double submit(CheckpointSnapshot snapshot, Builder build = {});

  /// Blocks until no write is in flight.
  void wait();

  /// Outcomes of the writes finished since the last call, oldest first.
  std::vector<WriteOutcome> finished();

 private:
  void loop();
  WriteOutcome write(CheckpointSnapshot& snapshot, const Builder& build);

  CheckpointStore& store_;
  const bool async_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<CheckpointSnapshot> pending_;
  Builder pending_build_;
  bool writing_ = false, stopping_ = false;
  int64_t completed_ = 0;  ///< successful writes, for the after_save fault hook
  std::vector<WriteOutcome> done_;
  std::thread thread_;
};

}  // namespace gpurun

#include "checkpoint/async_writer.h"

#include <chrono>

#include "gpurun/errors.h"
#include "util/faults.h"

namespace gpurun {

CheckpointWriter::CheckpointWriter(CheckpointStore& store, bool async)
    : store_(store), async_(async) {
  if (async_) thread_ = std::thread([this] { loop(); });
}

CheckpointWriter::~CheckpointWriter() {
  if (!async_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

WriteOutcome CheckpointWriter::write(CheckpointSnapshot& snapshot, const Builder& build) {
  WriteOutcome outcome;
  try {
    if (build) {
      const auto start = std::chrono::steady_clock::now();
      build(snapshot);
      outcome.build_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    outcome.result = store_.save(snapshot);
  } catch (const IoError& e) {
    outcome.error = e.what();
    outcome.error_number = e.error_number();
  } catch (const std::exception& e) {
    outcome.error = e.what();
  }
  outcome.meta = snapshot.meta;  // as the build left it, whether or not the write succeeded
  return outcome;
}

double CheckpointWriter::submit(CheckpointSnapshot snapshot, Builder build) {
  const auto start = std::chrono::steady_clock::now();
  if (!async_) {
    WriteOutcome outcome = write(snapshot, build);
    std::lock_guard<std::mutex> lock(mutex_);
    const bool ok = outcome.result.has_value();
    done_.push_back(std::move(outcome));
    if (ok) fault_point("after_save", ++completed_);
    return 0;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !pending_ && !writing_; });
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  pending_ = std::move(snapshot);
  pending_build_ = std::move(build);
  changed_.notify_all();
  return waited;
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !pending_ && !writing_; });
}

std::vector<WriteOutcome> CheckpointWriter::finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<WriteOutcome> out;
  out.swap(done_);
  return out;
}

void CheckpointWriter::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return pending_.has_value() || stopping_; });
    if (!pending_) return;  // stopping with nothing left to write
    CheckpointSnapshot snapshot = std::move(*pending_);
    Builder build = std::move(pending_build_);
    pending_.reset();
    pending_build_ = nullptr;
    writing_ = true;
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    WriteOutcome outcome = write(snapshot, build);
    outcome.queued_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Test hook, fired once the checkpoint (LATEST included) is complete on disk.
    if (outcome.result) fault_point("after_save", ++completed_);
    lock.lock();
    done_.push_back(std::move(outcome));
    writing_ = false;
    changed_.notify_all();
  }
}

}  // namespace gpurun

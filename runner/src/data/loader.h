// The loader: worker threads that fetch the coming batches of a pass (an epoch's micro-batches
// from a position on, or an evaluation) while the training thread computes, and hand them over
// strictly in order. As PyTorch's DataLoader(num_workers, prefetch_factor, pin_memory), with
// threads instead of processes (the data sets are C++ and release no interpreter lock).
//
// Exact resume: a batch is the data set's get_batch(indices, context) of its request, and a
// request is a function of (seed, epoch, position, rank) alone (epoch_requests()), so that the
// worker count and the timing never change what a step sees: workers 0, 1 and 4 give the same
// model_digest.
//
// With a CUDA device the workers copy each batch into pinned host memory, and the training
// thread copies it to the device non-blocking on a side stream, one batch ahead of the one in
// use; an event recorded after the copy is waited for by the compute stream before the batch is
// used, so the copy of batch k + 1 overlaps the compute of batch k.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "gpurun/dataset.h"
#include "gpurun/errors.h"

namespace gpurun {

/// One batch a loader fetches: the samples `indices` (int64 [B]) as `context` describes them
/// (context.positions: each sample's position in the epoch's permutation).
struct BatchRequest {
  at::Tensor indices;
  BatchContext context;
};

/// The batches of a pass, each made when it is asked for. An epoch of a large data set has
/// millions of micro-batches (a 10 GB token file: 300 000 at 16 windows of 1024), and a list of
/// them would grow with the data set (each request holds tensors of about 0.5 KB), so a pass
/// holds the rule and the shared order, never the list. Copies are cheap and share the order;
/// operator[] is safe from several threads at once.
class BatchRequests {
 public:
  BatchRequests() = default;
  /// `size` requests; `make(k)` gives request k in [0, size).
  BatchRequests(int64_t size, std::function<BatchRequest(int64_t)> make);
  size_t size() const { return static_cast<size_t>(size_); }
  bool empty() const { return size_ == 0; }
  /// Request `k`. Throws std::out_of_range outside [0, size()).
  BatchRequest operator[](int64_t k) const;

  /// Requests in order, by value (range-for).
  class Iterator {
   public:
    Iterator(const BatchRequests* requests, int64_t k) : requests_(requests), k_(k) {}
    BatchRequest operator*() const { return (*requests_)[k_]; }
    Iterator& operator++() {
      ++k_;
      return *this;
    }
    bool operator!=(const Iterator& other) const { return k_ != other.k_; }

   private:
    const BatchRequests* requests_;
    int64_t k_;
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size_}; }

 private:
  int64_t size_ = 0;
  std::function<BatchRequest(int64_t)> make_;
};

/// Rank `rank` of `world`'s part of an optimizer step's window (int64 [W]): samples rank,
/// rank + world, ... of it, disjoint shards that cover the window whatever its size (the short
/// last one included), so that no sample is padded or dropped and a resume with another world
/// size continues at the same position.
at::Tensor rank_shard(const at::Tensor& window, int rank, int world);

/// The micro-batches this rank fetches for the rest of an epoch, in the order the trainer uses
/// them: from `position` on, optimizer steps of `global_batch` samples of `order` (the epoch's
/// permutation, int64 [N]; the last window shorter), each step's rank_shard() cut into chunks of
/// at most `micro_batch`. Contexts carry `seed`, `epoch` and each sample's position in `order`.
/// Throws std::invalid_argument for a global_batch or micro_batch below 1.
BatchRequests epoch_requests(const at::Tensor& order, int64_t position, int64_t global_batch,
                             int64_t micro_batch, int rank, int world, int64_t seed, int64_t epoch);

/// Evaluation's batches: `indices` (int64) in chunks of at most `eval_batch`, each with the
/// evaluation context (epoch -1; positions: the indices themselves).
BatchRequests eval_requests(const at::Tensor& indices, int64_t eval_batch, int64_t seed);

/// data.workers resolved: a count as it is; `auto` (kAutoCount) the cores left beside
/// training, between 1 and 4. On a CUDA device the training thread mostly waits for kernels,
/// so half of `cores` may fetch; on the CPU the intra-op threads (`intra_op_threads`) are the
/// training, and the workers get the cores they leave.
int64_t resolve_workers(int64_t configured, bool cuda, int64_t cores, int64_t intra_op_threads);

/// data.prefetch resolved: a count as it is, `auto` 2 per worker (PyTorch's prefetch_factor).
int64_t resolve_prefetch(int64_t configured, int64_t workers);

/// The data set threw while a batch was fetched (a file that cannot be read, a plugin's bug).
/// The message names the sample's index and its position in the epoch, and the data set's own
/// words (which name its file when it says one). Exit 1: a restart may succeed.
class DataFailed : public Error {
 public:
  using Error::Error;
};

/// A stop was requested while the training thread waited for a batch (Options::stop_requested).
/// Not an error: the trainer saves at its last step boundary and exits 75.
class WaitInterrupted : public Error {
 public:
  WaitInterrupted() : Error("a stop was requested while waiting for a batch") {}
};

/// Fetches `requests` of `data` in order. Construction starts the workers; destruction (at the
/// pass's end, on an exception, on a stop) closes the queue and joins them, waiting at most for
/// the batch each is fetching. Not thread-safe: one consumer, the training thread.
class BatchLoader {
 public:
  struct Options {
    int64_t workers = 0;             ///< 0: each batch fetched in next(), on the calling thread
    int64_t prefetch = 2;            ///< batches ready or being fetched ahead of next(), at most
    c10::Device device = c10::kCPU;  ///< CUDA: pinned host memory and side-stream copies
    /// Polled while an interruptible next() waits for a worker (every 20 ms): true ends the
    /// wait with WaitInterrupted. Empty: wait until the batch is there.
    std::function<bool()> stop_requested;
  };

  BatchLoader(const Dataset& data, BatchRequests requests, Options options);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  /// The next request's batch; `indices` must be its indices (a check that the trainer and the
  /// loader walk the same order). With workers, inputs and targets are on Options::device,
  /// ready for the current stream; without, where the data set put them (host). Blocks while
  /// the batch is not ready; `interruptible`: a stop (Options::stop_requested) ends the wait
  /// with WaitInterrupted, the request still to come. The trainer allows it only for a step's
  /// first micro-batch, before any forward pass has drawn dropout or updated BatchNorm's
  /// statistics, so that a save there is the step boundary's state. Throws DataFailed (naming
  /// the sample), a gpurun::Error or c10::OutOfMemoryError of the data set as it is,
  /// WaitInterrupted, and std::logic_error past the last request or for other indices.
  Batch next(const at::Tensor& indices, bool interruptible = false);

  /// Seconds next() blocked since the last call (with workers 0: the whole fetch), and resets
  /// the sum: the training thread's data wait.
  double take_wait_seconds();

  /// Requests not yet returned by next().
  int64_t remaining() const { return static_cast<int64_t>(requests_.size()) - next_; }

 private:
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };
  struct DeviceCopy;  ///< the CUDA side stream and its in-flight copy (loader.cpp)

  Slot fetch(int64_t k) const;
  void work();
  Batch deliver(Slot slot, int64_t k);

  const Dataset& data_;
  const BatchRequests requests_;
  const Options options_;
  int64_t next_ = 0;  ///< the request next() returns next
  double wait_seconds_ = 0;

  std::mutex mutex_;
  std::condition_variable ready_cv_;  ///< a slot was filled
  std::condition_variable space_cv_;  ///< next() took a slot, or the loader closes
  std::map<int64_t, Slot> ready_;     ///< fetched, not yet taken
  int64_t claimed_ = 0;               ///< requests handed to workers so far
  int64_t consumed_ = 0;              ///< requests taken by next() (as next_, under the mutex)
  bool closed_ = false;
  std::vector<std::thread> threads_;
  std::unique_ptr<DeviceCopy> copy_;
};

}  // namespace gpurun

#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <c10/util/Exception.h>

#ifdef GPURUN_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "gpurun/config.h"
#include "util/clock.h"

namespace gpurun {

namespace {

using Clock = std::chrono::steady_clock;

/// "epoch 3, position 517" or "evaluation".
std::string where(const BatchContext& context, int64_t i) {
  if (!context.training()) return "evaluation";
  return "epoch " + std::to_string(context.epoch) + ", position " +
         std::to_string(context.positions[i].item<int64_t>()) + " of its permutation";
}

/// A request of the one sample `i` of `request`.
BatchRequest single(const BatchRequest& request, int64_t i) {
  BatchRequest one{request.indices.narrow(0, i, 1), request.context};
  one.context.positions = request.context.positions.narrow(0, i, 1);
  return one;
}

}  // namespace

at::Tensor rank_shard(const at::Tensor& window, int rank, int world) {
  if (world <= 1) return window;
  return window.slice(0, rank, window.numel(), world).contiguous();
}

BatchRequests::BatchRequests(int64_t size, std::function<BatchRequest(int64_t)> make)
    : size_(size), make_(std::move(make)) {}

BatchRequest BatchRequests::operator[](int64_t k) const {
  if (k < 0 || k >= size_)
    throw std::out_of_range("batch request " + std::to_string(k) + " of " + std::to_string(size_));
  return make_(k);
}

BatchRequests epoch_requests(const at::Tensor& order, int64_t position, int64_t global_batch,
                             int64_t micro_batch, int rank, int world, int64_t seed,
                             int64_t epoch) {
  if (global_batch < 1 || micro_batch < 1)
    throw std::invalid_argument("epoch_requests: global batch " + std::to_string(global_batch) +
                                ", micro-batch " + std::to_string(micro_batch));
  const int64_t n = order.numel();
  // Micro-batches of a window of `window` samples: rank_shard() takes samples rank, rank +
  // world, ... of it.
  const auto chunks_of = [=](int64_t window) {
    const int64_t mine =
        world <= 1 ? window : (window > rank ? (window - rank + world - 1) / world : 0);
    return (mine + micro_batch - 1) / micro_batch;
  };
  const int64_t remaining = std::max<int64_t>(0, n - position);
  const int64_t full = remaining / global_batch, tail = remaining % global_batch;
  const int64_t per_full = chunks_of(global_batch);
  const int64_t count = full * per_full + (tail > 0 ? chunks_of(tail) : 0);
  return BatchRequests(count, [=](int64_t k) {
    const int64_t w = per_full > 0 ? std::min(k / per_full, full) : full;
    const int64_t start = position + w * global_batch;
    const int64_t window = std::min(global_batch, n - start);
    const at::Tensor shard = rank_shard(order.narrow(0, start, window), rank, world);
    const at::Tensor positions =
        rank_shard(at::arange(start, start + window, at::kLong), rank, world);
    const int64_t first = (k - w * per_full) * micro_batch;
    const int64_t size = std::min(micro_batch, shard.numel() - first);
    return BatchRequest{shard.narrow(0, first, size),
                        BatchContext{seed, epoch, positions.narrow(0, first, size)}};
  });
}

BatchRequests eval_requests(const at::Tensor& indices, int64_t eval_batch, int64_t seed) {
  if (eval_batch < 1)
    throw std::invalid_argument("eval_requests: eval batch " + std::to_string(eval_batch));
  const int64_t n = indices.numel();
  return BatchRequests((n + eval_batch - 1) / eval_batch, [=](int64_t k) {
    const at::Tensor chunk =
        indices.narrow(0, k * eval_batch, std::min(eval_batch, n - k * eval_batch));
    return BatchRequest{chunk, BatchContext{seed, -1, chunk}};
  });
}

int64_t resolve_workers(int64_t configured, bool cuda, int64_t cores, int64_t intra_op_threads) {
  if (configured != kAutoCount) return configured;
  const int64_t spare = cuda ? cores / 2 : cores - intra_op_threads;
  return std::clamp<int64_t>(spare, 1, 4);
}

int64_t resolve_prefetch(int64_t configured, int64_t workers) {
  if (configured != kAutoCount) return configured;
  return std::max<int64_t>(2, 2 * workers);
}

#ifdef GPURUN_WITH_CUDA
/// The batch copied to the device on a side stream, and the event after its copy.
struct BatchLoader::DeviceCopy {
  struct InFlight {
    int64_t k = -1;  ///< the request it holds; -1: none
    Batch batch;
    at::cuda::CUDAEvent done;
  };

  explicit DeviceCopy(c10::Device on)
      : device(on), side(c10::cuda::getStreamFromPool(false, on.index())) {}

  /// Queues the copy of `host` (pinned) on the side stream; returns at once.
  void start(int64_t k, const Batch& host) {
    c10::cuda::CUDAStreamGuard guard(side);
    ahead.k = k;
    ahead.batch.inputs = host.inputs.to(device, /*non_blocking=*/true);
    ahead.batch.targets = host.targets.to(device, /*non_blocking=*/true);
    ahead.done.record(side);
  }

  /// The batch of the copy in flight, usable on the current (compute) stream: it waits for the
  /// copy's event, and the caching allocator is told the memory is used there (record_stream),
  /// so that it is not handed to the side stream's next copy while the compute still reads it.
  Batch take() {
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device.index());
    ahead.done.block(compute);
    Batch batch = std::move(ahead.batch);
    ahead = InFlight();
    batch.inputs.record_stream(compute);
    batch.targets.record_stream(compute);
    return batch;
  }

  c10::Device device;
  c10::cuda::CUDAStream side;
  InFlight ahead;
};
#else
struct BatchLoader::DeviceCopy {};
#endif

BatchLoader::BatchLoader(const Dataset& data, BatchRequests requests, Options options)
    : data_(data), requests_(std::move(requests)), options_(std::move(options)) {
  if (options_.workers <= 0 || requests_.empty()) return;
#ifdef GPURUN_WITH_CUDA
  if (options_.device.is_cuda()) copy_ = std::make_unique<DeviceCopy>(options_.device);
#endif
  const int64_t threads = std::min<int64_t>(options_.workers, requests_.size());
  try {
    for (int64_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    space_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
    throw;
  }
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  space_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

BatchLoader::Slot BatchLoader::fetch(int64_t k) const {
  const BatchRequest request = requests_[k];
  Slot slot;
  try {
    slot.batch = data_.get_batch(request.indices, request.context);
    if (options_.device.is_cuda() && options_.workers > 0) {
      // Pinned, so that the device copy can run asynchronously (a pageable copy is staged
      // through a pinned buffer by the driver, synchronously).
      if (slot.batch.inputs.is_cpu()) slot.batch.inputs = slot.batch.inputs.pin_memory();
      if (slot.batch.targets.is_cpu()) slot.batch.targets = slot.batch.targets.pin_memory();
    }
    return slot;
  } catch (const c10::OutOfMemoryError&) {
    slot.error = std::current_exception();
  } catch (const Error&) {
    slot.error = std::current_exception();  // gpurun's own (a data set's ConfigError): as it is
  } catch (const std::exception& e) {
    // Which sample: the batch's samples one by one, the first that throws named. A batch whose
    // samples all load alone failed as a batch: named by its first and last.
    const int64_t count = request.indices.numel();
    std::string message;
    for (int64_t i = 0; i < count && message.empty(); ++i) {
      const BatchRequest one = single(request, i);
      try {
        data_.get_batch(one.indices, one.context);
      } catch (const std::exception& alone) {
        message = "the data set failed on sample " +
                  std::to_string(request.indices[i].item<int64_t>()) + " (" +
                  where(request.context, i) + "): " + alone.what();
      }
    }
    if (message.empty())
      message = "the data set failed on the batch of samples " +
                std::to_string(request.indices[0].item<int64_t>()) + " ... " +
                std::to_string(request.indices[count - 1].item<int64_t>()) + " (" +
                where(request.context, 0) + "): " + e.what();
    slot.error = std::make_exception_ptr(DataFailed(message));
  }
  return slot;
}

void BatchLoader::work() {
  const int64_t n = static_cast<int64_t>(requests_.size());
  for (;;) {
    int64_t k = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      space_cv_.wait(lock, [&] {
        return closed_ || claimed_ >= n || claimed_ < consumed_ + options_.prefetch;
      });
      if (closed_ || claimed_ >= n) return;
      k = claimed_++;
    }
    Slot slot = fetch(k);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(k, std::move(slot));
    }
    ready_cv_.notify_all();
  }
}

Batch BatchLoader::next(const at::Tensor& indices, bool interruptible) {
  if (next_ >= static_cast<int64_t>(requests_.size()))
    throw std::logic_error("BatchLoader::next() past its last request");
  const int64_t k = next_;
  if (!at::equal(indices, requests_[k].indices))
    throw std::logic_error("BatchLoader::next(): request " + std::to_string(k) +
                           " holds other samples than the caller's");
  const auto start = Clock::now();
  if (threads_.empty()) {
    Slot slot = fetch(k);
    wait_seconds_ += seconds_since(start);
    ++next_;
    if (slot.error) std::rethrow_exception(slot.error);
    return std::move(slot.batch);
  }
  Slot slot;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      auto it = ready_.find(k);
      if (it != ready_.end()) {
        slot = std::move(it->second);
        ready_.erase(it);
        break;
      }
      ready_cv_.wait_for(lock, std::chrono::milliseconds(20));
      if (interruptible && ready_.count(k) == 0 && options_.stop_requested &&
          options_.stop_requested()) {
        wait_seconds_ += seconds_since(start);
        throw WaitInterrupted();
      }
    }
    consumed_ = ++next_;
  }
  space_cv_.notify_all();
  Batch batch = deliver(std::move(slot), k);
  wait_seconds_ += seconds_since(start);
  return batch;
}

Batch BatchLoader::deliver(Slot slot, int64_t k) {
  if (slot.error) std::rethrow_exception(slot.error);
#ifdef GPURUN_WITH_CUDA
  if (copy_) {
    if (copy_->ahead.k != k) copy_->start(k, slot.batch);
    Batch batch = copy_->take();
    // The next batch's copy starts now, behind this one's compute, when it is already fetched.
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = ready_.find(k + 1);
    if (it != ready_.end() && !it->second.error) copy_->start(k + 1, it->second.batch);
    return batch;
  }
#else
  (void)k;
#endif
  return std::move(slot.batch);
}

double BatchLoader::take_wait_seconds() {
  const double seconds = wait_seconds_;
  wait_seconds_ = 0;
  return seconds;
}

}  // namespace gpurun

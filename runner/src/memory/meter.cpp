#include "memory/meter.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <limits>
#include <new>
#include <string>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#ifdef GPURUN_WITH_CUDA
#define GPURUN_CUDA_METER 1
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

#include "gpurun/errors.h"

namespace gpurun {
namespace {

// ---------------------------------------------------------------------------------------------
// CPU

/// The live and peak byte counts of one CPU meter. Reference-counted by hand: the meter holds
/// one reference and every counted allocation one more, so an allocation that outlives its
/// meter still finds the counter when it is freed.
struct Counter {
  std::atomic<int64_t> current{0};  // bytes
  std::atomic<int64_t> peak{0};     // bytes
  std::atomic<int64_t> refs{1};
  int64_t limit = 0;  // bytes; <= 0: none

  void release() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
};

/// Placed in front of every allocation of a CountingCpuAllocator: what its deleter needs to
/// undo it (counter: null when the allocation was not counted). The data handed to LibTorch
/// starts kHeaderBytes after the inner allocation, which keeps the inner allocator's
/// alignment (c10::gAlignment, 64 bytes).
struct Header {
  void* inner_context;
  c10::DeleterFnPtr inner_deleter;
  Counter* counter;
  size_t nbytes;
};
constexpr size_t kHeaderBytes = 64;
static_assert(sizeof(Header) <= kHeaderBytes, "Header must fit in front of the data");

/// The deleter of every allocation of a CountingCpuAllocator. Its argument is both the data
/// and the context (as for LibTorch's default CPU allocator), so raw_allocate() and
/// raw_deallocate() work too.
void delete_counted(void* data) {
  // raw_deallocate() of a zero-byte raw_allocate() (mkldnn does both) passes the null data of
  // the uncounted empty allocation.
  if (data == nullptr) return;
  auto* header = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeaderBytes);
  Header h = *header;
  if (h.counter != nullptr) {
    h.counter->current.fetch_sub(static_cast<int64_t>(h.nbytes), std::memory_order_relaxed);
    h.counter->release();
  }
  h.inner_deleter(h.inner_context);
}

/// Wraps the CPU allocator that was installed before: adds a header to each allocation,
/// counts its bytes, and refuses an allocation that would cross the limit.
///
/// Every storage keeps a pointer to the allocator that made it and allocates through it when
/// it is resized, so an instance must outlive all storages made under its meter: the meter
/// never deletes it (a few dozen bytes per meter) and detaches it instead. A detached
/// allocator counts nothing and allocates through the CPU allocator in force at that moment,
/// so that resizes of old storages are seen by whichever meter is then active.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  CountingCpuAllocator(c10::Allocator* inner, Counter* counter)
      : inner_(inner), counter_(counter) {}

  c10::DataPtr allocate(size_t nbytes) override { return allocate_with_header(nbytes); }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_counted; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::copy_n(static_cast<const char*>(src), count, static_cast<char*>(dest));
  }

  /// Stops counting (the meter is going away); see the class comment.
  void detach() { detached_.store(true, std::memory_order_release); }

 private:
  c10::DataPtr allocate_with_header(size_t nbytes) const {
    Counter* counter = detached_.load(std::memory_order_acquire) ? nullptr : counter_;
    c10::Allocator* target = inner_;
    if (counter == nullptr && c10::GetCPUAllocator() != this) target = c10::GetCPUAllocator();
    if (nbytes == 0) return target->allocate(0);

    const auto n = static_cast<int64_t>(nbytes);
    if (counter != nullptr) reserve(n);
    c10::DataPtr inner;
    try {
      inner = target->allocate(nbytes + kHeaderBytes);
    } catch (...) {
      if (counter != nullptr) counter->current.fetch_sub(n, std::memory_order_relaxed);
      throw;
    }
    void* base = inner.get();
    c10::DeleterFnPtr inner_deleter = inner.get_deleter();
    void* inner_context = inner.release_context();
    if (counter != nullptr) counter->refs.fetch_add(1, std::memory_order_relaxed);
    new (base) Header{inner_context, inner_deleter, counter, nbytes};
    void* data = static_cast<char*>(base) + kHeaderBytes;
    return {data, data, &delete_counted, c10::Device(c10::DeviceType::CPU)};
  }

  /// Adds `n` bytes to the current count unless that crosses the limit (then throws
  /// c10::OutOfMemoryError and changes nothing), and raises the peak.
  void reserve(int64_t n) const {
    int64_t now = counter_->current.load(std::memory_order_relaxed);
    int64_t after = 0;
    do {
      after = now + n;
      if (counter_->limit > 0 && after > counter_->limit) {
        // C10_THROW_ERROR rather than TORCH_CHECK_WITH: the latter throws a plain c10::Error in
        // builds with STRIP_ERROR_MESSAGES, and callers catch c10::OutOfMemoryError.
        C10_THROW_ERROR(OutOfMemoryError,
                        c10::str("gpurun: CPU memory limit exceeded: tried to allocate ", n,
                                 " bytes with ", now, " bytes allocated of the limit of ",
                                 counter_->limit, " bytes (--memory-limit)"));
      }
    } while (!counter_->current.compare_exchange_weak(now, after, std::memory_order_relaxed));
    int64_t peak = counter_->peak.load(std::memory_order_relaxed);
    while (after > peak &&
           !counter_->peak.compare_exchange_weak(peak, after, std::memory_order_relaxed)) {
    }
  }

  c10::Allocator* inner_;
  Counter* counter_;
  std::atomic<bool> detached_{false};
};

/// The highest priority of c10::SetAllocator: an allocator set with a lower one is ignored,
/// and only an equal or higher one replaces it (c10/core/Allocator.h).
constexpr uint8_t kAllocatorPriority = std::numeric_limits<uint8_t>::max();

/// Physical RAM in bytes, or this process's cgroup memory limit when smaller.
int64_t host_memory_bytes() {
  int64_t bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  for (const char* path : {"/sys/fs/cgroup/memory.max",                       // cgroup v2
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {  // cgroup v1
    std::ifstream in(path);
    int64_t limit = 0;
    if (in >> limit && limit > 0) bytes = std::min(bytes, limit);  // "max" fails to parse
  }
  return bytes;
}

class CpuMeter final : public MemoryMeter {
 public:
  explicit CpuMeter(int64_t limit_bytes)
      : counter_(new Counter),
        previous_(c10::GetCPUAllocator()),
        allocator_(new CountingCpuAllocator(previous_, counter_)),
        device_(host_memory_bytes()),
        capacity_(limit_bytes > 0 ? limit_bytes : cpu_tensor_capacity_bytes(device_)) {
    // Always enforced: without a limit a probe or a step that outgrows the machine is killed
    // by the kernel (or another process is) instead of failing as an out-of-memory error.
    counter_->limit = capacity_;
    c10::SetCPUAllocator(allocator_, kAllocatorPriority);
  }

  ~CpuMeter() override {
    c10::SetCPUAllocator(previous_, kAllocatorPriority);
    allocator_->detach();  // not deleted: storages made under the meter point to it
    counter_->release();
  }

  CpuMeter(const CpuMeter&) = delete;
  CpuMeter& operator=(const CpuMeter&) = delete;

  void reset_peak() override {
    counter_->peak.store(counter_->current.load(std::memory_order_relaxed),
                         std::memory_order_relaxed);
  }
  int64_t current_bytes() const override {
    return counter_->current.load(std::memory_order_relaxed);
  }
  int64_t peak_bytes() const override { return counter_->peak.load(std::memory_order_relaxed); }
  int64_t capacity_bytes() const override { return capacity_; }
  int64_t device_bytes() const override { return device_; }
  std::string device_name() const override { return "cpu"; }

 private:
  Counter* counter_;
  c10::Allocator* previous_;
  CountingCpuAllocator* allocator_;
  int64_t device_;
  int64_t capacity_;
};

// ---------------------------------------------------------------------------------------------
// CUDA

#ifdef GPURUN_CUDA_METER
namespace cuda_alloc = c10::cuda::CUDACachingAllocator;

using Stat = c10::CachingDeviceAllocator::Stat;
using StatType = c10::CachingDeviceAllocator::StatType;

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(std::string("gpurun: ") + what + ": " + cudaGetErrorString(status));
}

class CudaMeter final : public MemoryMeter {
 public:
  CudaMeter(c10::DeviceIndex index, int64_t limit_bytes) : index_(index) {
    int previous = 0;
    check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
    check_cuda(cudaSetDevice(index_), "cudaSetDevice");
    size_t free_bytes = 0, total_bytes = 0;
    check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, index_), "cudaGetDeviceProperties");
    check_cuda(cudaSetDevice(previous), "cudaSetDevice");
    name_ = "cuda:" + std::to_string(index_) + " (" + prop.name + ")";
    device_ = static_cast<int64_t>(total_bytes);
    // The context (hundreds of MiB) and other processes' memory are not ours to plan with.
    capacity_ = static_cast<int64_t>(free_bytes) + reserved().current;
    if (limit_bytes > 0 && limit_bytes < capacity_) {
      capacity_ = limit_bytes;
      cuda_alloc::setMemoryFraction(
          static_cast<double>(limit_bytes) / static_cast<double>(total_bytes), index_);
      limited_ = true;
    }
  }

  ~CudaMeter() override {
    if (limited_) cuda_alloc::setMemoryFraction(1.0, index_);
  }

  void reset_peak() override { cuda_alloc::resetPeakStats(index_); }
  int64_t current_bytes() const override { return aggregate().current; }
  int64_t peak_bytes() const override { return aggregate().peak; }
  int64_t capacity_bytes() const override { return capacity_; }
  int64_t device_bytes() const override { return device_; }
  std::string device_name() const override { return name_; }
  int64_t reserved_bytes() const override { return reserved().current; }
  int64_t peak_reserved_bytes() const override { return reserved().peak; }
  void release_cached() override { cuda_alloc::emptyCache(); }

 private:
  /// allocated_bytes over both pools (small and large): bytes handed to tensors, not the
  /// allocator's cached reserve.
  Stat aggregate() const {
    return cuda_alloc::getDeviceStats(index_)
        .allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)];
  }
  Stat reserved() const {
    return cuda_alloc::getDeviceStats(index_)
        .reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)];
  }

  c10::DeviceIndex index_;
  std::string name_;
  int64_t device_ = 0;
  int64_t capacity_ = 0;
  bool limited_ = false;
};
#endif  // GPURUN_CUDA_METER

}  // namespace

int64_t cpu_tensor_capacity_bytes(int64_t host_bytes) {
  return host_bytes - std::max(kNonTensorReserveMinBytes, host_bytes / kNonTensorReserveDivisor);
}

std::unique_ptr<MemoryMeter> make_cpu_meter(int64_t limit_bytes) {
  return std::make_unique<CpuMeter>(limit_bytes);
}

std::unique_ptr<MemoryMeter> make_meter(const c10::Device& device, int64_t limit_bytes) {
  if (device.is_cpu()) return make_cpu_meter(limit_bytes);
  if (device.is_cuda()) {
#ifdef GPURUN_CUDA_METER
    c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
    return std::make_unique<CudaMeter>(index, limit_bytes);
#else
    throw ConfigError("device " + device.str() +
                      ": this gpurun was built without CUDA (GPURUN_WITH_CUDA); use --device "
                      "cpu or rebuild against a LibTorch with CUDA");
#endif
  }
  throw ConfigError("device " + device.str() + ": no memory meter for this device type; " +
                    "gpurun measures cpu and cuda");
}

}  // namespace gpurun

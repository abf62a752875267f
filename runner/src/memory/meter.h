// Measuring the real peak memory of training steps (docs/architecture.md, "Memory").
//
// A MemoryMeter reports the bytes that live on one device: the current amount, the peak since
// the last reset_peak(), and the device's capacity. The memory planner runs a few training
// steps under a meter and reads peak_bytes() as `measured_peak_bytes`.
//
//   CPU   every allocation made through LibTorch's CPU allocator while the meter is alive,
//         counted exactly by an allocator wrapper installed with c10::SetCPUAllocator. With a
//         limit, the wrapper throws c10::OutOfMemoryError at the allocation that would cross
//         it, so `--memory-limit` on CPU exercises the same recovery path as a CUDA OOM.
//   CUDA  c10::cuda::CUDACachingAllocator's statistics (allocated_bytes, aggregate pool); only
//         in builds with GPURUN_WITH_CUDA, i.e. against a LibTorch built with CUDA.
//
// All amounts are bytes (int64_t).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <c10/core/Device.h>

namespace gpurun {

class MemoryMeter {
 public:
  virtual ~MemoryMeter() = default;

  /// Sets the peak to the current amount, so that peak_bytes() measures what follows.
  virtual void reset_peak() = 0;

  /// Bytes allocated now (that the meter accounts for; see make_cpu_meter / make_meter).
  virtual int64_t current_bytes() const = 0;

  /// Highest current_bytes() since the meter was made or reset_peak() was last called.
  virtual int64_t peak_bytes() const = 0;

  /// Bytes the run may use on the device: the device's size, or the memory limit when one is
  /// set and smaller.
  virtual int64_t capacity_bytes() const = 0;

  /// The device's own memory in bytes, whatever the limit: for the CPU the physical RAM, or
  /// this process's cgroup memory limit when smaller; for CUDA the device's total memory.
  virtual int64_t device_bytes() const = 0;

  /// The device in words, e.g. "cpu" or "cuda:0 (NVIDIA H200)".
  virtual std::string device_name() const = 0;

  /// Bytes the allocator holds from the device now and at most since reset_peak(): on CUDA
  /// the caching allocator's reserved bytes (allocated plus its cache; what nvidia-smi sees
  /// of the tensors), >= current_bytes(); on the CPU, which caches nothing, the same as
  /// current_bytes() and peak_bytes().
  virtual int64_t reserved_bytes() const { return current_bytes(); }
  virtual int64_t peak_reserved_bytes() const { return peak_bytes(); }

  /// Gives the allocator's cached, unused blocks back to the device (CUDA: emptyCache), as
  /// after an out-of-memory error, so that a retry with a smaller micro-batch finds the memory
  /// unfragmented. No-op on the CPU.
  virtual void release_cached() {}
};

/// A meter of host memory allocated through LibTorch's CPU allocator (every CPU tensor's
/// storage, including those that intra-op worker threads and the autograd engine allocate).
///
/// While the returned meter is alive, c10::GetCPUAllocator() is a wrapper around the allocator
/// that was installed before; the meter's destructor puts that one back. Only allocations
/// made through the wrapper are counted, and only their frees decrement the count, so
/// tensors that existed before the meter do not count (and freeing them never makes the
/// count negative); tensors allocated under the meter and freed after it are handled safely.
/// Counting is exact: current_bytes() is the sum of the sizes LibTorch asked for (storage
/// nbytes) of the live allocations; the wrapper's own 64-byte header per allocation is not
/// counted. Zero-byte allocations are passed through uncounted.
///
/// `limit_bytes` > 0: an allocation that would make current_bytes() exceed the limit throws
/// c10::OutOfMemoryError (naming the limit, the request and the current amount) before any
/// memory is taken; everything allocated before stays valid and is freed normally.
/// `limit_bytes` <= 0: no limit.
///
/// capacity_bytes(): `limit_bytes` when > 0 (even above the machine's memory), else
/// cpu_tensor_capacity_bytes(device_bytes()), where device_bytes() is the physical RAM
/// (sysconf), or the cgroup memory limit of this process when that is smaller. The capacity is
/// always enforced as the limit, so that no probe or step can take the machine's memory and
/// be killed by the kernel: it fails as an out-of-memory error that the planner and the trainer
/// handle.
///
/// Why a wrapping allocator and not a c10::MemoryReportingInfoBase installed with
/// c10::DebugInfoGuard (docs/architecture.md, "LibTorch facts the code relies on"): that hook is
/// thread-local state, which LibTorch's OpenMP intra-op threads do not inherit, so an allocation
/// inside a parallel_for body is not reported; and it cannot refuse an allocation. The wrapper sees
/// every thread.
///
/// Install and destroy meters while no other thread is allocating (c10::SetCPUAllocator is
/// not thread-safe) and destroy nested meters in reverse order of creation. A meter made
/// while another is alive allocates through it, so the outer one also counts the inner one's
/// headers. The wrapper is installed with the highest priority (255), so later
/// c10::SetCPUAllocator calls with a lower priority are ignored, also after the meter is gone.
/// The wrapper object (a few dozen bytes) is never freed, because storages made under the
/// meter keep a pointer to it and allocate through it when they grow; after the meter is
/// gone it forwards such allocations, uncounted, to the CPU allocator then in force.
std::unique_ptr<MemoryMeter> make_cpu_meter(int64_t limit_bytes);

/// What the host keeps for memory that is not a tensor of the run: the libraries, the data set
/// held in memory, the pickled image of a checkpoint being written, the allocator's
/// fragmentation, and the other processes of the machine: max(1 GiB, an eighth of the host).
constexpr int64_t kNonTensorReserveMinBytes = int64_t{1} << 30;
constexpr int64_t kNonTensorReserveDivisor = 8;

/// The bytes a CPU run's tensors may take on a host of `host_bytes` (physical RAM or cgroup
/// limit) when memory.capacity is auto and no --memory-limit is given: `host_bytes` less the
/// reserve above; a fixed function of the machine, so that a resume on the same machine reuses
/// its checkpoint's plan. Negative or zero for a host under 1 GiB.
int64_t cpu_tensor_capacity_bytes(int64_t host_bytes);

/// A meter for `device`: make_cpu_meter(limit_bytes) for a CPU device; for a CUDA device
/// (its index, or the current device when it has none) the caching allocator's statistics,
/// which cover every allocation of this process on that device, also those made before the
/// meter. On CUDA, a `limit_bytes` smaller than the device is enforced with the caching
/// allocator's memory fraction (its own OutOfMemoryError); the fraction is reset to 1 when
/// the meter is destroyed. capacity_bytes() is what this process can have: the memory free
/// when the meter is made (cudaMemGetInfo, once the CUDA context exists, so that the context
/// and other processes on a shared card are left out) plus what this process's caching
/// allocator already reserved, or the limit when smaller. cuBLAS and cuDNN workspaces are
/// allocated through the caching allocator, so the measured peak includes them.
/// Throws ConfigError for a CUDA device when gpurun was built without CUDA, and for any other
/// device type.
std::unique_ptr<MemoryMeter> make_meter(const c10::Device& device, int64_t limit_bytes);

}  // namespace gpurun

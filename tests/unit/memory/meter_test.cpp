// Unit tests of memory measurement (MemoryMeter): exact CPU byte counts, the CPU memory limit
// and OOM recovery, and the CUDA meter (skipped without a GPU).
#include <ATen/ops/cross_entropy_loss.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "builtin.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "memory/meter.h"
#include "model/activation_checkpointing.h"

namespace gpurun {
namespace {

namespace nn = torch::nn;

constexpr int64_t kMiB = 1 << 20;

// ---------------------------------------------------------------------------------------------
// MemoryMeter (CPU)

TEST(MemoryMeter, CountsExactBytesOfCpuTensors) {
  auto meter = make_cpu_meter(0);
  const int64_t base = meter->current_bytes();
  meter->reset_peak();
  {
    at::Tensor a = at::empty({1000}, at::kFloat);  // 4000 bytes
    EXPECT_EQ(meter->current_bytes() - base, 4000);
    at::Tensor b = at::empty({250}, at::kDouble);  // 2000 bytes
    EXPECT_EQ(meter->current_bytes() - base, 6000);
    a.reset();
    EXPECT_EQ(meter->current_bytes() - base, 2000);
  }
  EXPECT_EQ(meter->peak_bytes() - base, 6000);
  EXPECT_EQ(meter->current_bytes(), base);
  meter->reset_peak();
  EXPECT_EQ(meter->peak_bytes(), base);
  EXPECT_EQ(meter->device_name(), "cpu");
  EXPECT_GT(meter->capacity_bytes(), 0);
}

TEST(MemoryMeter, CountsTheTemporariesOfAnOperation) {
  at::Tensor x = at::ones({64, 64});
  auto meter = make_cpu_meter(0);
  // (x + 1) is a temporary of 16384 bytes, alive while its product with x (16384 bytes) is
  // computed; afterwards only the result lives.
  at::Tensor y = (x + 1) * x;
  EXPECT_EQ(meter->current_bytes(), 64 * 64 * 4);
  EXPECT_EQ(meter->peak_bytes(), 2 * 64 * 64 * 4);
}

TEST(MemoryMeter, IgnoresFreesOfTensorsAllocatedBeforeIt) {
  at::Tensor old = at::empty({4096}, at::kFloat);
  auto meter = make_cpu_meter(0);
  old.reset();
  EXPECT_EQ(meter->current_bytes(), 0);
  at::Tensor fresh = at::empty({10}, at::kFloat);
  EXPECT_EQ(meter->current_bytes(), 40);
}

TEST(MemoryMeter, RestoresThePreviousAllocatorAndOutlivesItsTensors) {
  c10::Allocator* before = c10::GetCPUAllocator();
  at::Tensor survivor;
  {
    auto outer = make_cpu_meter(0);
    EXPECT_NE(c10::GetCPUAllocator(), before);
    {
      auto inner = make_cpu_meter(0);  // wraps the outer one: both count
      survivor = at::empty({100}, at::kFloat);
      EXPECT_EQ(inner->current_bytes(), 400);
      EXPECT_EQ(outer->current_bytes(), 400 + 64);  // the outer one sees the inner's header
    }
    EXPECT_EQ(outer->current_bytes(), 400 + 64);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  survivor.fill_(1.0f);
  EXPECT_EQ(survivor.sum().item<float>(), 100.0f);

  // A storage allocates through the allocator that made it when it grows: that one outlives
  // its meter and hands the allocation to the meter active now.
  auto later = make_cpu_meter(0);
  survivor.resize_({1000});
  survivor.fill_(2.0f);
  EXPECT_EQ(survivor.sum().item<float>(), 2000.0f);
  EXPECT_EQ(later->current_bytes(), 4000 + 64);  // seen through the old allocator's header
  survivor.reset();                              // frees through counters whose meters are gone
  EXPECT_EQ(later->current_bytes(), 0);
}

TEST(MemoryMeter, CountsAllocationsOfEveryThread) {
  auto meter = make_cpu_meter(0);
  constexpr int kThreads = 8, kRounds = 200;
  std::atomic<int> ready{0};
  std::vector<at::Tensor> kept(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      for (int r = 0; r < kRounds; ++r) at::Tensor scratch = at::empty({256 + r}, at::kFloat);
      kept[t] = at::empty({1000}, at::kFloat);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(meter->current_bytes(), kThreads * 4000);
  EXPECT_GE(meter->peak_bytes(), kThreads * 4000);
  // At most every thread's kept tensor and one scratch tensor (<= 455 floats) at a time.
  EXPECT_LE(meter->peak_bytes(), kThreads * (4000 + 455 * 4));
  kept.clear();
  EXPECT_EQ(meter->current_bytes(), 0);
}

TEST(MemoryMeter, LimitThrowsAtTheCrossingAllocationOnly) {
  auto meter = make_cpu_meter(10000);
  EXPECT_EQ(meter->capacity_bytes(), 10000);
  at::Tensor a = at::empty({1000}, at::kFloat);  // 4000
  at::Tensor b = at::empty({1500}, at::kFloat);  // 6000: exactly at the limit, allowed
  EXPECT_EQ(meter->current_bytes(), 10000);
  try {
    at::Tensor c = at::empty({1}, at::kFloat);  // 10004 > 10000
    ADD_FAILURE() << "no c10::OutOfMemoryError at the crossing allocation";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("limit of 10000 bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(meter->current_bytes(), 10000);  // the refused allocation took nothing
  a.reset();
  EXPECT_EQ(meter->current_bytes(), 6000);
  at::Tensor c = at::empty({1000}, at::kFloat);  // fits again after the free
  EXPECT_EQ(meter->current_bytes(), 10000);
  b.reset();
  c.fill_(2.0f);
  EXPECT_EQ(c.sum().item<float>(), 2000.0f);  // sum's 4-byte result fits now
  EXPECT_EQ(meter->peak_bytes(), 10000);
}

/// An MLP 256 -> 512 -> 512 -> 10 and a batch; its parameters and gradients exist before the
/// meters of the test, so the meters see only what one step allocates.
struct OomFixture {
  std::shared_ptr<SegmentedModel> model = std::make_shared<SegmentedModel>();
  at::Tensor x, y;
  OomFixture() {
    torch::manual_seed(0);
    model->add_segment("a", nn::Sequential(nn::Linear(256, 512), nn::ReLU()));
    model->add_segment("b", nn::Sequential(nn::Linear(512, 512), nn::ReLU()));
    model->add_segment("head", nn::Sequential(nn::Linear(512, 10)));
    x = torch::randn({512, 256});
    y = torch::randint(10, {512});
    step(nullptr);  // allocates the .grad tensors
    model->zero_grad(/*set_to_none=*/false);
  }
  /// Forward and backward on the whole batch; sets *forward_done after the forward pass.
  void step(bool* forward_done) {
    at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
    if (forward_done) *forward_done = true;
    loss.backward();
  }
};

TEST(MemoryMeter, CaughtOomReturnsAllocatedBytesToTheBaseline) {
  OomFixture f;
  int64_t forward_peak = 0, step_peak = 0;
  {
    auto probe = make_cpu_meter(0);
    {
      at::Tensor loss = at::cross_entropy_loss(f.model->forward(f.x), f.y);
      forward_peak = probe->peak_bytes();
      loss.backward();
    }
    step_peak = probe->peak_bytes();
    EXPECT_EQ(probe->current_bytes(), 0);
  }
  std::printf("[          ] MLP 256-512-512-10, batch 512: forward peak %lld B, step peak %lld B\n",
              static_cast<long long>(forward_peak), static_cast<long long>(step_peak));
  ASSERT_GT(step_peak, forward_peak);

  // A limit below the forward pass's peak fails in forward; one between the two, in backward.
  for (int64_t limit : {forward_peak / 2, (forward_peak + step_peak) / 2}) {
    {
      auto meter = make_cpu_meter(limit);
      const int64_t baseline = meter->current_bytes();
      bool forward_done = false, caught = false;
      try {
        f.step(&forward_done);
      } catch (const c10::OutOfMemoryError&) {
        caught = true;
      }
      EXPECT_TRUE(caught) << "limit " << limit;
      EXPECT_EQ(forward_done, limit > forward_peak) << "limit " << limit;
      EXPECT_EQ(meter->current_bytes(), baseline) << "limit " << limit;
      EXPECT_LE(meter->peak_bytes(), limit);
    }

    // And the same step runs again once memory allows it.
    f.model->zero_grad(/*set_to_none=*/false);
    auto unlimited = make_cpu_meter(0);
    f.step(nullptr);
    EXPECT_EQ(unlimited->peak_bytes(), step_peak);
  }
}

TEST(MemoryMeter, MakeMeterRefusesUnsupportedDevices) {
  EXPECT_THROW(make_meter(c10::Device(c10::DeviceType::Meta), 0), ConfigError);
  EXPECT_EQ(make_meter(c10::Device(c10::DeviceType::CPU), 123)->capacity_bytes(), 123);
  if (!torch::cuda::is_available()) {
    // Without CUDA in this build: ConfigError; with it but no device: an Error from CUDA.
    EXPECT_THROW(make_meter(c10::Device(c10::DeviceType::CUDA, 0), 0), Error);
  }
}

TEST(MemoryMeter, DeviceBytesAreTheMachinesWhateverTheLimit) {
  const int64_t machine = make_cpu_meter(0)->device_bytes();
  auto above = make_cpu_meter(int64_t{1} << 50);         // 1 PiB
  EXPECT_EQ(above->capacity_bytes(), int64_t{1} << 50);  // on the CPU a limit is taken as given
  EXPECT_EQ(above->device_bytes(), machine);
  EXPECT_EQ(make_cpu_meter(123)->device_bytes(), machine);
}

// Issue 31, item 1: without a limit the meter counted and never refused, so a probe of a step
// larger than the machine was killed by the kernel (exit 137) instead of failing as an
// out-of-memory error. The auto capacity leaves room for what is not a tensor and is enforced.
TEST(MemoryMeter, AutoCapacityLeavesRoomForWhatIsNotATensorAndIsEnforced) {
  auto meter = make_cpu_meter(0);
  const int64_t host = meter->device_bytes();
  EXPECT_EQ(meter->capacity_bytes(), cpu_tensor_capacity_bytes(host));
  EXPECT_LE(meter->capacity_bytes(), host - (int64_t{1} << 30));
  EXPECT_LE(meter->capacity_bytes(), host - host / 8);
  EXPECT_GT(meter->capacity_bytes(), host / 2);
  // One byte over the capacity is refused before any memory is taken.
  const int64_t before = meter->current_bytes();
  EXPECT_THROW(at::empty({meter->capacity_bytes() - before + 1}, at::kByte), c10::OutOfMemoryError);
  EXPECT_EQ(meter->current_bytes(), before);
  EXPECT_EQ(cpu_tensor_capacity_bytes(int64_t{64} << 30), int64_t{56} << 30);
  EXPECT_EQ(cpu_tensor_capacity_bytes(int64_t{4} << 30), int64_t{3} << 30);
}

TEST(MemoryMeter, ReservedCoversAllocatedAndTheCacheGoesBack_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto meter = make_meter(c10::Device(c10::DeviceType::CUDA, 0), 0);
  {
    at::Tensor a = at::empty({64 * kMiB}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
    EXPECT_GE(meter->reserved_bytes(), meter->current_bytes());
  }
  EXPECT_GE(meter->reserved_bytes() - meter->current_bytes(), 64 * kMiB);  // cached
  meter->release_cached();
  EXPECT_LT(meter->reserved_bytes() - meter->current_bytes(), 64 * kMiB);
  EXPECT_GE(meter->peak_reserved_bytes(), meter->peak_bytes());
  // The context and other processes are not counted as ours to plan with.
  EXPECT_LT(meter->capacity_bytes(), meter->device_bytes());
}

TEST(MemoryMeter, LimitIsTheCachingAllocatorsMemoryFraction_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto meter = make_meter(c10::Device(c10::DeviceType::CUDA, 0), 256 * kMiB);
  EXPECT_EQ(meter->capacity_bytes(), 256 * kMiB);
  EXPECT_THROW(at::empty({512 * kMiB}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA)),
               c10::OutOfMemoryError);
  at::Tensor fits = at::empty({64 * kMiB}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  EXPECT_GE(meter->current_bytes(), 64 * kMiB);
}

TEST(MemoryMeter, PeakMatchesAllocator_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto meter = make_meter(c10::Device(c10::DeviceType::CUDA, 0), 0);
  const int64_t base = meter->current_bytes();
  meter->reset_peak();
  {
    // 4 MiB: a multiple of the caching allocator's 512-byte rounding, so counted exactly.
    at::Tensor a = at::empty({kMiB}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
    EXPECT_EQ(meter->current_bytes() - base, 4 * kMiB);
  }
  EXPECT_EQ(meter->peak_bytes() - base, 4 * kMiB);
  EXPECT_EQ(meter->current_bytes(), base);
  EXPECT_GT(meter->capacity_bytes(), 4 * kMiB);
  EXPECT_EQ(meter->device_bytes(), meter->capacity_bytes());  // no limit
}

}  // namespace
}  // namespace gpurun

#include "train/device.h"

#include <cstdlib>

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <torch/cuda.h>

#include <spdlog/spdlog.h>

#include "gpurun/errors.h"

namespace gpurun {

c10::Device select_device(const std::string& name, int local_rank) {
  if (name == "cpu") return c10::kCPU;
  if (name != "cuda" && name != "auto")
    throw ConfigError("--device must be auto, cpu or cuda, got \"" + name + "\"");
  if (!torch::cuda::is_available()) {
    if (name == "cuda") throw ConfigError("--device cuda: no CUDA device is available");
    return c10::kCPU;
  }
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (local_rank < 0 || local_rank >= count)
    throw ConfigError("local rank " + std::to_string(local_rank) + " needs CUDA device " +
                      std::to_string(local_rank) + ", but this process sees " +
                      std::to_string(count) + " (CUDA_VISIBLE_DEVICES, --nproc-per-node)");
  // Before cuBLAS's first handle; a user's own setting wins.
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
  at::accelerator::setDeviceIndex(device.index());
  return device;
}

void set_determinism(const c10::Device& device, bool deterministic) {
  if (!device.is_cuda()) return;
  at::Context& context = at::globalContext();
  context.setDeterministicCuDNN(deterministic);
  context.setBenchmarkCuDNN(!deterministic);
  context.setDeterministicAlgorithms(deterministic, /*warn_only=*/true);
  if (!deterministic)
    spdlog::warn(
        "train.deterministic is false: cuBLAS and cuDNN may pick non-deterministic "
        "algorithms, so a resumed run is not bit-identical to an uninterrupted one");
}

}  // namespace gpurun

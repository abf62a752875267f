#include "model/precision.h"

#include <ATen/cpu/Utils.h>

#include <stdexcept>

#ifdef GPURUN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "gpurun/errors.h"

namespace gpurun {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    case Precision::kFp32:
      break;
  }
  return "fp32";
}

c10::ScalarType autocast_dtype(Precision p) {
  switch (p) {
    case Precision::kBf16:
      return c10::kBFloat16;
    case Precision::kFp16:
      return c10::kHalf;
    case Precision::kFp32:
      break;
  }
  return c10::kFloat;
}

namespace {

/// Whether the CPU computes bf16 natively (cpuinfo's flags, as oneDNN's bf16 kernels need).
bool cpu_has_bf16() {
  const auto caps = at::cpu::get_cpu_capabilities();
  const auto flag = [&](const char* name) {
    const auto it = caps.find(name);
    return it != caps.end() && it->second.isBool() && it->second.toBool();
  };
  return flag("avx512_bf16") || flag("amx_bf16");
}

/// torch.cuda.is_bf16_supported(including_emulation=False): compute capability 8.0 or newer.
bool cuda_has_bf16(c10::Device device) {
#ifdef GPURUN_WITH_CUDA
  return at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->major >= 8;
#else
  (void)device;
  return false;
#endif
}

}  // namespace

ResolvedPrecision resolve_precision(const std::string& setting, c10::Device device) {
  if (setting == "fp32") return {Precision::kFp32, "train.precision"};
  if (setting == "bf16") return {Precision::kBf16, "train.precision"};
  if (setting == "fp16") return {Precision::kFp16, "train.precision"};
  if (setting != "auto")
    throw ConfigError("train.precision must be one of fp32, bf16, fp16, auto, got " + setting);
  if (device.is_cuda()) {
    if (cuda_has_bf16(device)) return {Precision::kBf16, "auto: the GPU computes bf16"};
    return {Precision::kFp16,
            "auto: the GPU has no bf16 (compute capability < 8): fp16 with "
            "a gradient scaler"};
  }
  if (cpu_has_bf16()) return {Precision::kBf16, "auto: the CPU has AVX512-BF16 or AMX-BF16"};
  return {Precision::kFp32, "auto: the CPU has no bf16 units, so a narrower dtype is no faster"};
}

AutocastGuard::AutocastGuard(Precision precision, c10::Device device) {
  if (precision != Precision::kFp32) scope_.emplace(device.type(), true, autocast_dtype(precision));
}

}  // namespace gpurun

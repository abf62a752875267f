// gpurun's own version, as recorded in manifests and leases and printed by --version.
#pragma once

#include <string>

namespace gpurun {

/// The project version from CMake (project(gpurun VERSION ...)), e.g. "0.1.0".
const char* gpurun_version();

/// What --version prints: "gpurun 0.1.0 (LibTorch 2.11.0, CUDA yes, NCCL yes)": the LibTorch
/// this binary was built against, and whether its CUDA and NCCL paths were compiled in.
std::string version_line();

}  // namespace gpurun

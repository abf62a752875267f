#include "util/version.h"

#include <torch/version.h>  // TORCH_VERSION only

namespace gpurun {

// GPURUN_VERSION is defined for this file alone by runner/CMakeLists.txt, so that a version
// bump recompiles one file and no build can fall back to a made-up version.
const char* gpurun_version() { return GPURUN_VERSION; }

std::string version_line() {
#ifdef GPURUN_WITH_CUDA
  const char* cuda = "yes";
#else
  const char* cuda = "no";
#endif
#ifdef GPURUN_WITH_NCCL
  const char* nccl = "yes";
#else
  const char* nccl = "no";
#endif
  return std::string("gpurun ") + GPURUN_VERSION + " (LibTorch " + TORCH_VERSION + ", CUDA " +
         cuda + ", NCCL " + nccl + ")";
}

}  // namespace gpurun

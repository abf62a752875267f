#include "util/version.h"

namespace gpurun {

// GPURUN_VERSION is defined for this file alone by runner/CMakeLists.txt, so that a version
// bump recompiles one file and no build can fall back to a made-up version.
const char* gpurun_version() { return GPURUN_VERSION; }

}  // namespace gpurun

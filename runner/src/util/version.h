// gpurun's own version, as recorded in manifests and leases and printed by --version.
#pragma once

namespace gpurun {

/// The project version from CMake (project(gpurun VERSION ...)), e.g. "0.1.0".
const char* gpurun_version();

}  // namespace gpurun

// A plugin that claims another ABI version: gpurun must refuse it, naming both versions, before
// calling its init (which would register nothing anyway).
#include "gpurun/plugin.h"

GPURUN_PLUGIN_EXPORT int gpurun_plugin_abi_version(void) { return GPURUN_PLUGIN_ABI_VERSION + 1; }
GPURUN_PLUGIN_EXPORT int gpurun_plugin_init(int, gpurun::Registry*) { return 0; }

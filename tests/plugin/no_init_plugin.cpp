// A library with the right ABI version but without the entry point gpurun_plugin_init.
#include "gpurun/plugin.h"

GPURUN_PLUGIN_EXPORT int gpurun_plugin_abi_version(void) { return GPURUN_PLUGIN_ABI_VERSION; }

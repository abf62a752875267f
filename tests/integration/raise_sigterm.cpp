// Preloaded into gpurun by StopSignal.ASigtermWhileItsLibrariesInitialiseExits75: a SIGTERM
// raised by a library initializer, when LibTorch's run (most of a second on a loaded machine).
#include <csignal>

__attribute__((constructor)) static void raise_sigterm_while_initialising() { std::raise(SIGTERM); }

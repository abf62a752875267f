// gpurun: parse the command line, call the library, map errors to exit codes
// (docs/architecture.md).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include <spdlog/spdlog.h>

#include "builtin.h"
#include "cli/command_line.h"
#include "gpurun/errors.h"
#include "gpurun/registry.h"
#include "util/error_report.h"
#include "util/signals.h"

namespace {
void block_stop_signals_at_load(int, char**, char**) { gpurun::block_stop_signals(); }
}  // namespace

// Run by the dynamic loader once every library is loaded and relocated, before any of their
// initializers (util/signals.h): from here on a stop signal waits for main() instead of
// killing the process. Only an executable has a .preinit_array.
__attribute__((section(".preinit_array"),
               used)) static void (*const kBlockStopSignals)(int, char**,
                                                             char**) = block_stop_signals_at_load;

namespace {

int run(int argc, char** argv) {
  try {
    gpurun::Command command = gpurun::parse_command_line(argc, argv);
    gpurun::Registry registry;
    gpurun::register_builtin_plugins(registry);
    return gpurun::run_command(command, registry, std::cout);
  } catch (const std::exception& e) {
    const int code = gpurun::exit_code_for(e);
    const std::string message = gpurun::error_message(e);
    gpurun::leave_error_report(e, code, message);  // for a supervisor, when it asked for one
    if (code == gpurun::kExitSignal)
      spdlog::warn("{}", message);
    else
      spdlog::error("{}", message);
    return code;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // First, so that a signal at any moment of the run ends in exit 75, never 143.
  gpurun::install_signal_handlers();
  gpurun::setup_logging();
  const int code = run(argc, argv);
  // Everything of ours is closed, joined and written by now (run()'s scope). What exit() would
  // add is LibTorch's static destructors, which deregister thousands of operators and unload
  // the CUDA libraries: about 0.15 s of every process's end, on a rented box's clock (the cost
  // ledger counts to the run's last event). Streams are flushed, then the process ends.
  std::cout.flush();
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

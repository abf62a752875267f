// The command line (docs/architecture.md, "Command line"), parsed with cxxopts into a Command, and
// the dispatch of each subcommand to the library. runner/cli/main.cpp only wires these together.
#pragma once

#include <exception>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "launch/launcher.h"
#include "train/trainer.h"

namespace gpurun {

class Registry;

struct Command {
  enum class Kind { kRun, kPlan, kCkpt, kStatus, kReport, kExport, kQueue, kHelp, kVersion };
  Kind kind = Kind::kHelp;
  std::string config_path;             ///< run, plan; queue: QUEUE.yaml
  std::vector<std::string> overrides;  ///< --set KEY=VALUE, in order (the last wins)
  RunOptions run;                      ///< run
  std::string action;                  ///< ckpt: list | verify | inspect
  std::string dir;            ///< ckpt DIR, status and report RUN_DIR, export CKPT_DIR, queue --dir
  int parallel = 1;           ///< queue: --parallel N
  std::string to;             ///< export: --to FILE
  std::string out;            ///< report: --out FILE.html ("": DIR/report.html)
  bool merge_lora = false;    ///< export: --merge-lora
  std::string format = "pt";  ///< export: --format pt | hf | peft
  std::string dtype;          ///< export: --dtype ("": the format's default)
  int64_t max_shard_bytes = 5'000'000'000;  ///< export: --max-shard-size
  std::optional<int64_t> step;              ///< export: --step N
  bool best = false;                        ///< export: --best
  std::string cards;                        ///< plan: --cards FILE ("": the bundled table)
  double deadline_hours = 72;               ///< plan: --deadline HOURS
  bool estimate_only = false;               ///< plan: --estimate-only
  bool probe_precisions = false;            ///< plan: --probe-precisions
  int64_t world_size = 1;                   ///< plan: --world-size N
  bool json = false;                        ///< --json: one JSON object on stdout, logs on stderr
  std::string help;                         ///< the --help text
  LaunchRequest launch;  ///< run: restarts, DDP flags, the workers' command line;
                         ///< queue: max_restarts
};

/// Parses argv. Throws ConfigError (exit 2) for an unknown option, a missing argument or an
/// unknown subcommand, with the usage hint.
Command parse_command_line(int argc, const char* const argv[]);

/// Runs `command`; returns the exit code. Throws what the subcommand throws (main maps it);
/// with --json it first prints {"error": MESSAGE, "exit_code": CODE} to `out`, so that stdout
/// holds one JSON object whatever happened. `registry` holds the built-in models; run and plan
/// add model.plugin's (plugin_loader.h).
int run_command(const Command& command, Registry& registry, std::ostream& out);

/// The message to show for `e`: what(), without the C++ backtrace of LibTorch's errors.
std::string error_message(const std::exception& e);

/// Logs to stderr as "gpurun LEVEL message"; GPURUN_LOG_LEVEL=debug|info|warn overrides.
void setup_logging();

}  // namespace gpurun

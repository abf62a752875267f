#include "cli/command_line.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <c10/util/Exception.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
// --set values hold commas ("model.hidden=[64,32]"): never split them into several values.
#define CXXOPTS_VECTOR_DELIMITER '\0'
#include <cxxopts.hpp>

#include "cli/ckpt_command.h"
#include "cli/export_command.h"
#include "cli/options.h"
#include "cli/plan_command.h"
#include "cli/queue_command.h"
#include "cli/report_command.h"
#include "cli/status_command.h"
#include "gpurun/config.h"
#include "gpurun/errors.h"
#include "launch/launcher.h"
#include "model/plugin_loader.h"
#include "util/signals.h"
#include "util/text.h"
#include "util/units.h"
#include "util/version.h"

namespace gpurun {
namespace {

const char* const kDescription =
    "gpurun: train a LibTorch model with checkpoints that survive a reclaimed machine";

const char* const kUsage =
    "[run] CONFIG.yaml --ckpt DIR [--resume] [--set KEY=VALUE]... [options]\n"
    "  gpurun [run] CONFIG.yaml --ckpt DIR --nproc-per-node N [--nnodes N --node-rank R\n"
    "         --master-addr HOST --master-port PORT] [--max-restarts N] ...\n"
    "  gpurun plan CONFIG.yaml [--memory-limit SIZE] [--set KEY=VALUE]... [--cards FILE]\n"
    "              [--deadline HOURS] [--world-size N] [--estimate-only] [--probe-precisions]\n"
    "              [--json]\n"
    "  gpurun ckpt list|verify|inspect DIR [--json]\n"
    "  gpurun status RUN_DIR|QUEUE_DIR [--json]\n"
    "  gpurun report RUN_DIR|QUEUE_DIR [--out FILE.html]\n"
    "  gpurun queue QUEUE.yaml --dir DIR [--parallel N] [--max-restarts N] [--hang-timeout S]\n"
    "  gpurun export CKPT_DIR --to PATH [--format pt|hf|peft] [--merge-lora] [--step N | --best]";

const char* const kFooter = R"(
Typical use, the same line after every interruption:
  gpurun --resume --ckpt /mnt/nas/exp1 examples/fashion_mnist.yaml

Exit codes: 0 finished, 2 usage or config error, 3 cannot resume,
            75 stopped by a signal after saving (run again with --resume), 1 other failure.
)";

cxxopts::Options make_options() {
  cxxopts::Options options("gpurun", kDescription);
  options.custom_help(kUsage);
  options.positional_help("");
  for (const OptionSpec& o : option_table()) {
    std::shared_ptr<cxxopts::Value> value;
    switch (o.type) {
      case OptionSpec::Type::kFlag:
        value = cxxopts::value<bool>();
        break;
      case OptionSpec::Type::kString:
        value = cxxopts::value<std::string>();
        break;
      case OptionSpec::Type::kStrings:
        value = cxxopts::value<std::vector<std::string>>();
        break;
      case OptionSpec::Type::kInt:
        value = cxxopts::value<int>();
        break;
      case OptionSpec::Type::kDouble:
        value = cxxopts::value<double>();
        break;
    }
    if (*o.default_value) value->default_value(o.default_value);
    options.add_options(o.group)(o.name, o.help, value, o.value_name);
  }
  options.add_options("hidden")("positional", "", cxxopts::value<std::vector<std::string>>());
  options.parse_positional({"positional"});
  return options;
}

[[noreturn]] void usage_error(const std::string& message) {
  throw ConfigError(message + "\n(see gpurun --help)");
}

/// The supervised worker's command line: ours without the launcher's options, argv[0] this
/// very binary. A restarted worker resumes on its own (GPURUN_RESTART_COUNT > 0), so that the
/// first run still refuses a directory that holds checkpoints when --resume is not given.
std::vector<std::string> worker_argv(int argc, const char* const argv[]) {
  // The resolved path of this binary, so that `ps` and `pgrep -f gpurun` show the workers.
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  std::vector<std::string> args(argv, argv + argc);
  if (args.empty()) args.emplace_back();
  args[0] = ec ? std::string("/proc/self/exe") : self;
  return without_launcher_options(args);
}

/// cxxopts names the value it could not convert but not the option ("Argument 'abc' failed to
/// parse"): "--deadline abc: expected a number" names both, found in argv (`--opt VALUE` or
/// `--opt=VALUE`) with the option's type from the table.
std::string bad_value_message(const std::string& what, int argc, const char* const argv[]) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (!starts_with(a, "--")) continue;
    const size_t eq = a.find('=');
    const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const std::string value =
        eq != std::string::npos ? a.substr(eq + 1) : (i + 1 < argc ? argv[i + 1] : "");
    // cxxopts quotes the value with typographic quotes (or ASCII ones, by its build options).
    if (value.empty() || (what.find("\u2018" + value + "\u2019") == std::string::npos &&
                          what.find("'" + value + "'") == std::string::npos))
      continue;
    for (const OptionSpec& o : option_table()) {
      if (o.name != name ||
          (o.type != OptionSpec::Type::kInt && o.type != OptionSpec::Type::kDouble))
        continue;
      const bool whole = o.type == OptionSpec::Type::kInt;
      return "--" + name + " " + value + ": expected " + (whole ? "a whole number" : "a number") +
             (*o.value_name ? std::string(" (") + o.value_name + ")" : "");
    }
  }
  return what;
}

}  // namespace

Command parse_command_line(int argc, const char* const argv[]) {
  cxxopts::Options options = make_options();
  Command cmd;
  cmd.help = options.help(option_groups()) + kFooter;
  cxxopts::ParseResult r;
  try {
    r = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
    usage_error(bad_value_message(e.what(), argc, argv));
  } catch (const cxxopts::exceptions::exception& e) {
    usage_error(e.what());
  }
  if (r.count("help")) return cmd;
  if (r.count("version")) {
    cmd.kind = Command::Kind::kVersion;
    return cmd;
  }
  std::vector<std::string> args;
  if (r.count("positional")) args = r["positional"].as<std::vector<std::string>>();
  if (args.empty()) usage_error("missing CONFIG.yaml");
  cmd.json = r.count("json") > 0;
  const std::string first = args[0];
  if (first == "ckpt") {
    if (args.size() != 3 || (args[1] != "list" && args[1] != "verify" && args[1] != "inspect"))
      usage_error("usage: gpurun ckpt list|verify|inspect DIR [--json]");
    cmd.kind = Command::Kind::kCkpt;
    cmd.action = args[1];
    cmd.dir = args[2];
    return cmd;
  }
  if (first == "status") {
    if (args.size() != 2) usage_error("usage: gpurun status RUN_DIR [--json]");
    cmd.kind = Command::Kind::kStatus;
    cmd.dir = args[1];
    return cmd;
  }
  if (first == "report") {
    if (args.size() != 2) usage_error("usage: gpurun report RUN_DIR|QUEUE_DIR [--out FILE.html]");
    cmd.kind = Command::Kind::kReport;
    cmd.dir = args[1];
    if (r.count("out")) {
      cmd.out = r["out"].as<std::string>();
      if (cmd.out.empty()) usage_error("--out needs a file name (default: DIR/report.html)");
    }
    return cmd;
  }
  if (first == "queue") {
    if (args.size() != 2 || !r.count("dir"))
      usage_error("usage: gpurun queue QUEUE.yaml --dir DIR [--parallel N] [--max-restarts N]");
    cmd.kind = Command::Kind::kQueue;
    cmd.config_path = args[1];
    cmd.dir = r["dir"].as<std::string>();
    cmd.parallel = r["parallel"].as<int>();
    cmd.launch.max_restarts = r["max-restarts"].as<int>();
    cmd.launch.hang_timeout = r["hang-timeout"].as<double>();
    if (cmd.parallel < 1) usage_error("--parallel must be >= 1");
    if (cmd.launch.max_restarts < 0) usage_error("--max-restarts must be >= 0");
    if (cmd.launch.hang_timeout < 0) usage_error("--hang-timeout must be >= 0");
    return cmd;
  }
  if (first == "export") {
    if (args.size() != 2 || !r.count("to"))
      usage_error(
          "usage: gpurun export CKPT_DIR --to PATH [--format pt|hf|peft] [--dtype D] "
          "[--merge-lora] [--step N | --best]");
    cmd.kind = Command::Kind::kExport;
    cmd.dir = args[1];
    cmd.to = r["to"].as<std::string>();
    cmd.merge_lora = r.count("merge-lora") > 0;
    cmd.best = r.count("best") > 0;
    cmd.format = r["format"].as<std::string>();
    cmd.max_shard_bytes = parse_size(r["max-shard-size"].as<std::string>());
    if (cmd.max_shard_bytes <= 0) usage_error("--max-shard-size must be above 0");
    if (cmd.format != "pt" && cmd.format != "hf" && cmd.format != "peft")
      usage_error("--format must be pt, hf or peft, got " + cmd.format);
    if (r.count("dtype")) {
      cmd.dtype = r["dtype"].as<std::string>();
      if (cmd.dtype != "float32" && cmd.dtype != "bfloat16" && cmd.dtype != "float16")
        usage_error("--dtype must be float32, bfloat16 or float16, got " + cmd.dtype);
      if (cmd.format == "pt") usage_error("--dtype is for --format hf and peft");
    }
    if (r.count("step")) {
      cmd.step = r["step"].as<int>();
      if (*cmd.step < 0) usage_error("--step must be >= 0");
    }
    return cmd;
  }
  if (r.count("set")) cmd.overrides = r["set"].as<std::vector<std::string>>();
  if (r.count("memory-limit")) {
    cmd.run.memory_limit = parse_size(r["memory-limit"].as<std::string>());
    if (cmd.run.memory_limit <= 0) usage_error("--memory-limit must be a positive SIZE");
  }
  cmd.run.device = r["device"].as<std::string>();
  if (first == "plan") {
    if (args.size() != 2)
      usage_error(
          "usage: gpurun plan CONFIG.yaml [--memory-limit SIZE] [--cards FILE] [--deadline HOURS] "
          "[--world-size N] [--estimate-only] [--probe-precisions] [--json]");
    cmd.kind = Command::Kind::kPlan;
    cmd.config_path = args[1];
    if (r.count("cards")) cmd.cards = r["cards"].as<std::string>();
    cmd.deadline_hours = r["deadline"].as<double>();
    if (!(cmd.deadline_hours > 0)) usage_error("--deadline must be a positive number of hours");
    cmd.estimate_only = r.count("estimate-only") > 0;
    cmd.probe_precisions = r.count("probe-precisions") > 0;
    cmd.world_size = r["world-size"].as<int>();
    if (cmd.world_size < 1) usage_error("--world-size must be at least 1");
    return cmd;
  }
  if (first == "run") args.erase(args.begin());
  if (args.size() != 1)
    usage_error(args.empty() ? "missing CONFIG.yaml" : "unexpected argument \"" + args[1] + "\"");
  cmd.kind = Command::Kind::kRun;
  cmd.config_path = args[0];
  if (!r.count("ckpt")) usage_error("--ckpt DIR is required: where checkpoints go");
  cmd.run.ckpt_dir = r["ckpt"].as<std::string>();
  if (r.count("run-dir")) cmd.run.run_dir = r["run-dir"].as<std::string>();
  cmd.run.resume = r.count("resume") > 0;
  cmd.run.force = r.count("force") > 0;
  cmd.run.no_lease = r.count("no-lease") > 0;
  cmd.run.allow_data_change = r.count("allow-data-change") > 0;
  LaunchRequest& launch = cmd.launch;
  launch.max_restarts = r["max-restarts"].as<int>();
  launch.hang_timeout = r["hang-timeout"].as<double>();
  if (launch.max_restarts < 0) usage_error("--max-restarts must be >= 0");
  if (launch.hang_timeout < 0) usage_error("--hang-timeout must be >= 0");
  if (r.count("nproc-per-node")) launch.flags.nproc_per_node = r["nproc-per-node"].as<int>();
  if (r.count("nnodes")) launch.flags.nnodes = r["nnodes"].as<int>();
  if (r.count("node-rank")) launch.flags.node_rank = r["node-rank"].as<int>();
  if (r.count("master-addr")) launch.flags.master_addr = r["master-addr"].as<std::string>();
  if (r.count("master-port")) launch.flags.master_port = r["master-port"].as<int>();
  if (r.count("slurm-signal")) {
    launch.slurm_signal = r["slurm-signal"].as<std::string>();
    if (launch.slurm_signal.empty()) usage_error("--slurm-signal needs a signal, e.g. B:USR1@120");
  }
  launch.worker_argv = worker_argv(argc, argv);
  if (const char* restarts = std::getenv("GPURUN_RESTART_COUNT"))
    cmd.run.restart_count = std::atoll(restarts);
  // A restarted worker continues from the last checkpoint.
  if (cmd.run.restart_count > 0) cmd.run.resume = true;
  return cmd;
}

namespace {

int dispatch(const Command& cmd, Registry& registry, std::ostream& out) {
  switch (cmd.kind) {
    case Command::Kind::kHelp:
      out << cmd.help;
      return kExitOk;
    case Command::Kind::kVersion:
      out << version_line() << "\n";
      return kExitOk;
    case Command::Kind::kCkpt:
      exit_at_first_signal("ckpt");  // it only reads: nothing to save, nothing to wait for
      return ckpt_command(cmd.action, cmd.dir, cmd.json, out);
    case Command::Kind::kStatus:
      exit_at_first_signal("status");
      return status_command(cmd.dir, cmd.json, out);
    case Command::Kind::kReport:
      return report_command(cmd.dir, cmd.out, out);
    case Command::Kind::kExport:
      return export_command(cmd.dir, cmd.to, out, cmd.merge_lora, cmd.step, cmd.format, cmd.dtype,
                            cmd.max_shard_bytes, cmd.best);
    case Command::Kind::kQueue:
      return queue_command(cmd.config_path, cmd.dir, cmd.parallel, cmd.launch.max_restarts,
                           cmd.launch.hang_timeout, out);
    case Command::Kind::kPlan: {
      // A plan saves nothing: Ctrl-C or SIGTERM during a probe ends it at once.
      exit_at_first_signal("plan");
      RunConfig config = load_config(cmd.config_path, cmd.overrides);
      load_configured_plugin(config, registry);
      PlanOptions options;
      if (!cmd.cards.empty()) options.cards = load_cards(cmd.cards);
      options.deadline_hours = cmd.deadline_hours;
      options.estimate_only = cmd.estimate_only;
      options.probe_precisions = cmd.probe_precisions;
      options.world_size = cmd.world_size;
      return plan_command(config, cmd.run.device, cmd.run.memory_limit, cmd.json, registry, options,
                          out);
    }
    case Command::Kind::kRun: {
      RunConfig config = load_config(cmd.config_path, cmd.overrides);
      // In the launcher too: a plugin that cannot load is refused before any worker starts.
      load_configured_plugin(config, registry);
      return launch_or_train(config, cmd.run, cmd.launch, registry);
    }
  }
  return kExitFailure;
}

}  // namespace

std::string error_message(const std::exception& e) {
  // LibTorch's errors carry a C++ backtrace that means nothing to a user.
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  return torch_error ? torch_error->what_without_backtrace() : e.what();
}

int run_command(const Command& cmd, Registry& registry, std::ostream& out) {
  if (!cmd.json) return dispatch(cmd, registry, out);
  try {
    return dispatch(cmd, registry, out);
  } catch (const std::exception& e) {
    // --json promises one object on stdout, also when the command fails.
    const nlohmann::json error{{"error", error_message(e)}, {"exit_code", exit_code_for(e)}};
    out << error.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    throw;
  }
}

void setup_logging() {
  auto logger = spdlog::stderr_color_mt("gpurun");
  logger->set_pattern("%^gpurun %l%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::level::level_enum level = spdlog::level::info;
  if (const char* env = std::getenv("GPURUN_LOG_LEVEL")) level = spdlog::level::from_str(env);
  spdlog::set_level(level);
}

}  // namespace gpurun

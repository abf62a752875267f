#include "gpurun/cli.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
// --set values hold commas ("model.hidden=[64,32]"): never split them into several values.
#define CXXOPTS_VECTOR_DELIMITER '\0'
#include <cxxopts.hpp>

#include "gpurun/ckpt_command.h"
#include "gpurun/config.h"
#include "gpurun/errors.h"
#include "gpurun/export_command.h"
#include "gpurun/plan_command.h"
#include "gpurun/plugin_loader.h"
#include "gpurun/supervisor.h"
#include "gpurun/status.h"

#ifndef GPURUN_VERSION
#define GPURUN_VERSION "0.0.0"
#endif

namespace gpurun {
namespace {

const char* const kDescription =
    "gpurun: train a LibTorch model with checkpoints that survive a reclaimed machine";

const char* const kUsage =
    "[run] CONFIG.yaml --ckpt DIR [--resume] [--set KEY=VALUE]... [options]\n"
    "  gpurun [run] CONFIG.yaml --ckpt DIR --nproc-per-node N [--nnodes N --node-rank R\n"
    "         --master-addr HOST --master-port PORT] [--max-restarts N] ...\n"
    "  gpurun plan CONFIG.yaml [--memory-limit SIZE] [--set KEY=VALUE]... [--json]\n"
    "  gpurun ckpt list|verify|inspect DIR [--json]\n"
    "  gpurun status RUN_DIR [--json]\n"
    "  gpurun export CKPT_DIR --to FILE";

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
  // clang-format off
  options.add_options("Run")
    ("ckpt", "checkpoint directory (local or network storage); created when missing", cxxopts::value<std::string>(), "DIR")
    ("resume", "continue from the newest complete checkpoint in --ckpt; starts fresh when there is none")
    ("run-dir", "where metrics.jsonl and status.json go (default: the --ckpt directory)", cxxopts::value<std::string>(), "DIR")
    ("set", "override a config key by its dotted path, e.g. --set train.epochs=3 (repeatable; the last wins)", cxxopts::value<std::vector<std::string>>(), "KEY=VALUE")
    ("force", "take the checkpoint directory's lease at once, even from a run that looks alive")
    ("device", "auto, cpu or cuda", cxxopts::value<std::string>()->default_value("auto"), "D")
    ("max-restarts", "run training in a child process and restart it with --resume after a crash, at most N times", cxxopts::value<int>()->default_value("0"), "N")
    ("hang-timeout", "kill and restart a run that completes no step for SECONDS (needs --max-restarts)", cxxopts::value<double>()->default_value("0"), "SECONDS")
    ("memory-limit", "treat the device as having SIZE bytes (e.g. 512MiB, 24GiB); on CPU enforced by the allocator", cxxopts::value<std::string>(), "SIZE");
  options.add_options("Distributed (DDP; under Slurm these come from SLURM_*)")
    ("nproc-per-node", "start N worker processes on this node (Gloo on CPU, NCCL on CUDA)", cxxopts::value<int>(), "N")
    ("nnodes", "nodes in the job", cxxopts::value<int>(), "N")
    ("node-rank", "this node's index, 0..nnodes-1", cxxopts::value<int>(), "R")
    ("master-addr", "host of rank 0 (the rendezvous store)", cxxopts::value<std::string>(), "HOST")
    ("master-port", "TCP port of the rendezvous store", cxxopts::value<int>(), "PORT");
  options.add_options("Export")
    ("to", "export: the file to write the newest complete checkpoint's model to", cxxopts::value<std::string>(), "FILE");
  options.add_options("Output")
    ("json", "print exactly one JSON object on stdout (ckpt, status)")
    ("h,help", "show this help")
    ("version", "print the version");
  options.add_options("hidden")
    ("positional", "", cxxopts::value<std::vector<std::string>>());
  // clang-format on
  options.parse_positional({"positional"});
  return options;
}

[[noreturn]] void usage_error(const std::string& message) {
  throw ConfigError(message + "\n(see gpurun --help)");
}

/// Options of the launcher, not of its workers (each takes a value).
const char* const kLauncherOptions[] = {"--max-restarts", "--hang-timeout", "--nproc-per-node",
                                        "--nnodes",       "--node-rank",    "--master-addr",
                                        "--master-port"};

bool is_launcher_option(const std::string& a, bool* takes_next) {
  for (const char* option : kLauncherOptions) {
    const std::string o = option;
    if (a == o) {
      *takes_next = true;
      return true;
    }
    if (a.rfind(o + "=", 0) == 0) {
      *takes_next = false;
      return true;
    }
  }
  return false;
}

/// The supervised worker's command line: ours without the launcher's options, argv[0] this
/// very binary. A restarted worker resumes on its own (GPURUN_RESTART_COUNT > 0), so that the
/// first run still refuses a directory that holds checkpoints when --resume is not given.
std::vector<std::string> worker_argv(int argc, const char* const argv[]) {
  // The resolved path of this binary, so that `ps` and `pgrep -f gpurun` show the workers.
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  std::vector<std::string> out{ec ? std::string("/proc/self/exe") : self};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool takes_next = false;
    if (is_launcher_option(a, &takes_next)) {
      i += takes_next ? 1 : 0;
      continue;
    }
    out.push_back(a);
  }
  return out;
}

/// `gpurun run`: a worker of a distributed job (WORLD_SIZE set by our launcher, torchrun or
/// Slurm), the launcher of this node's workers (several ranks, or restarts asked for), or a
/// single process.
int run_training(const Command& cmd, Registry& registry) {
  RunConfig config = load_config(cmd.config_path, cmd.overrides);
  // In the launcher too: a plugin that cannot load is refused before any worker starts.
  load_configured_plugin(config, registry);
  Environment env = current_environment();
  if (slurm_runs_workers(env))
    for (const auto& [key, value] : worker_env_from_slurm(env)) env[key] = value;
  RunOptions run = cmd.run;
  run.dist = worker_env(env);
  const std::string run_dir = run.run_dir.empty() ? run.ckpt_dir : run.run_dir;
  if (!run.dist) {
    LaunchSpec spec = resolve_launch(cmd.launch, env);
    const int world = spec.nnodes * spec.nproc_per_node;
    if (world > 1 || cmd.max_restarts > 0 || cmd.hang_timeout > 0) {
      SupervisorOptions s;
      // The workers re-read the config; an error in it surfaced above, unretried.
      s.argv = cmd.child_argv;
      s.max_restarts = cmd.max_restarts;
      s.hang_timeout = cmd.hang_timeout;
      const int first_rank = spec.node_rank * spec.nproc_per_node;
      s.progress_file = heartbeat_path(run_dir, first_rank);
      if (isatty(STDERR_FILENO)) s.env["GPURUN_STDERR_TTY"] = "1";
      if (world > 1) {
        if (spec.nnodes == 1 && !master_port_given(cmd.launch, env))
          spec.master_port = find_free_port();
        spdlog::info("launching ranks {}..{} of {} on node {} of {}; rendezvous at {}:{}",
                     first_rank, first_rank + spec.nproc_per_node - 1, world, spec.node_rank,
                     spec.nnodes, spec.master_addr, spec.master_port);
        for (int i = 0; i < spec.nproc_per_node; ++i)
          s.workers.push_back({worker_variables(spec, i), "rank " + std::to_string(first_rank + i),
                               heartbeat_path(run_dir, first_rank + i)});
      }
      return supervise(s);
    }
  } else if (cmd.launch.nproc_per_node || cmd.launch.nnodes) {
    spdlog::warn("WORLD_SIZE is set, so this process is one worker (rank {} of {}); "
                 "--nproc-per-node and --nnodes are ignored",
                 run.dist->rank, run.dist->world_size);
  }
  if (!run.dist || run.dist->rank == 0) spdlog::info("{}", format_resolved(config));
  train(config, run, registry);
  return kExitOk;
}

}  // namespace

Command parse_command_line(int argc, const char* const argv[]) {
  cxxopts::Options options = make_options();
  Command cmd;
  cmd.help = options.help({"Run", "Distributed (DDP; under Slurm these come from SLURM_*)", "Export",
                           "Output"}) +
             kFooter;
  cxxopts::ParseResult r;
  try {
    r = options.parse(argc, argv);
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
  if (first == "export") {
    if (args.size() != 2 || !r.count("to")) usage_error("usage: gpurun export CKPT_DIR --to FILE");
    cmd.kind = Command::Kind::kExport;
    cmd.dir = args[1];
    cmd.to = r["to"].as<std::string>();
    return cmd;
  }
  if (r.count("set")) cmd.overrides = r["set"].as<std::vector<std::string>>();
  if (r.count("memory-limit")) {
    cmd.run.memory_limit = parse_size(r["memory-limit"].as<std::string>());
    if (cmd.run.memory_limit <= 0) usage_error("--memory-limit must be a positive SIZE");
  }
  cmd.run.device = r["device"].as<std::string>();
  if (first == "plan") {
    if (args.size() != 2) usage_error("usage: gpurun plan CONFIG.yaml [--memory-limit SIZE] [--json]");
    cmd.kind = Command::Kind::kPlan;
    cmd.config_path = args[1];
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
  cmd.max_restarts = r["max-restarts"].as<int>();
  cmd.hang_timeout = r["hang-timeout"].as<double>();
  if (cmd.max_restarts < 0) usage_error("--max-restarts must be >= 0");
  if (cmd.hang_timeout < 0) usage_error("--hang-timeout must be >= 0");
  if (r.count("nproc-per-node")) cmd.launch.nproc_per_node = r["nproc-per-node"].as<int>();
  if (r.count("nnodes")) cmd.launch.nnodes = r["nnodes"].as<int>();
  if (r.count("node-rank")) cmd.launch.node_rank = r["node-rank"].as<int>();
  if (r.count("master-addr")) cmd.launch.master_addr = r["master-addr"].as<std::string>();
  if (r.count("master-port")) cmd.launch.master_port = r["master-port"].as<int>();
  cmd.child_argv = worker_argv(argc, argv);
  if (const char* restarts = std::getenv("GPURUN_RESTART_COUNT"))
    cmd.run.restart_count = std::atoll(restarts);
  // A restarted worker continues from the last checkpoint.
  if (cmd.run.restart_count > 0) cmd.run.resume = true;
  return cmd;
}

int run_command(const Command& cmd, Registry& registry, std::ostream& out) {
  switch (cmd.kind) {
    case Command::Kind::kHelp:
      out << cmd.help;
      return kExitOk;
    case Command::Kind::kVersion:
      out << "gpurun " << GPURUN_VERSION << "\n";
      return kExitOk;
    case Command::Kind::kCkpt:
      return ckpt_command(cmd.action, cmd.dir, cmd.json, out);
    case Command::Kind::kStatus:
      return status_command(cmd.dir, cmd.json, out);
    case Command::Kind::kExport:
      return export_command(cmd.dir, cmd.to, out);
    case Command::Kind::kPlan: {
      RunConfig config = load_config(cmd.config_path, cmd.overrides);
      load_configured_plugin(config, registry);
      return plan_command(config, cmd.run.device, cmd.run.memory_limit, cmd.json, registry, out);
    }
    case Command::Kind::kRun:
      return run_training(cmd, registry);
  }
  return kExitFailure;
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

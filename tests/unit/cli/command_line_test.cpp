// Unit tests of the command-line parser (docs/architecture.md's "Command line"): every subcommand's
// shape, --set order, SIZE parsing, the launcher-only options and the errors a typo gets.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/command_line.h"
#include "cli/options.h"
#include "cli/status_command.h"
#include "common/temp_dir.h"
#include "gpurun/errors.h"

namespace gpurun {
namespace {

Command parse(std::vector<std::string> args) {
  args.insert(args.begin(), "gpurun");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(CommandLine, RunTakesTheConfigTheDirectoryAndTheOverridesInOrder) {
  const Command c = parse({"--resume", "--ckpt", "/ckpt", "run.yaml", "--set", "train.epochs=3",
                           "--set", "model.hidden=[64,32]", "--set", "train.epochs=4",
                           "--memory-limit", "512MiB", "--device", "cpu"});
  EXPECT_EQ(c.kind, Command::Kind::kRun);
  EXPECT_EQ(c.config_path, "run.yaml");
  EXPECT_EQ(c.run.ckpt_dir, "/ckpt");
  EXPECT_TRUE(c.run.resume);
  EXPECT_FALSE(c.run.force);
  EXPECT_EQ(c.run.device, "cpu");
  EXPECT_EQ(c.run.memory_limit, 512LL << 20);
  // The commas of a list stay in one value; the last --set of a key is applied last.
  EXPECT_EQ(c.overrides,
            (std::vector<std::string>{"train.epochs=3", "model.hidden=[64,32]", "train.epochs=4"}));
  EXPECT_EQ(parse({"run", "r.yaml", "--ckpt", "d"}).config_path, "r.yaml");
}

TEST(CommandLine, LauncherOptionsAreParsedAndLeftOutOfTheWorkersCommandLine) {
  const Command c = parse({"r.yaml", "--ckpt", "d", "--nproc-per-node", "2", "--max-restarts=3",
                           "--hang-timeout", "4.5", "--master-port", "29400", "--resume"});
  EXPECT_EQ(c.launch.flags.nproc_per_node, 2);
  EXPECT_EQ(c.launch.max_restarts, 3);
  EXPECT_DOUBLE_EQ(c.launch.hang_timeout, 4.5);
  EXPECT_EQ(c.launch.flags.master_port, 29400);
  ASSERT_FALSE(c.launch.worker_argv.empty());
  const std::vector<std::string> rest(c.launch.worker_argv.begin() + 1, c.launch.worker_argv.end());
  EXPECT_EQ(rest, (std::vector<std::string>{"r.yaml", "--ckpt", "d", "--resume"}));
}

TEST(CommandLine, EveryLauncherOnlyOptionOfTheTableIsDropped) {
  for (const OptionSpec& o : option_table()) {
    if (!o.launcher_only) continue;
    const std::string flag = std::string("--") + o.name;
    EXPECT_EQ(without_launcher_options({"gpurun", "r.yaml", flag, "1", "--ckpt", "d"}),
              (std::vector<std::string>{"gpurun", "r.yaml", "--ckpt", "d"}))
        << flag;
    EXPECT_EQ(without_launcher_options({"gpurun", flag + "=1", "r.yaml"}),
              (std::vector<std::string>{"gpurun", "r.yaml"}))
        << flag;
  }
  // A worker's own options stay, also when they look like a launcher option's prefix.
  EXPECT_EQ(without_launcher_options({"gpurun", "--nnodes-extra", "--ckpt=d"}),
            (std::vector<std::string>{"gpurun", "--nnodes-extra", "--ckpt=d"}));
}

TEST(CommandLine, OtherSubcommands) {
  Command c = parse({"ckpt", "verify", "/d", "--json"});
  EXPECT_EQ(c.kind, Command::Kind::kCkpt);
  EXPECT_EQ(c.action, "verify");
  EXPECT_EQ(c.dir, "/d");
  EXPECT_TRUE(c.json);
  c = parse({"status", "/run"});
  EXPECT_EQ(c.kind, Command::Kind::kStatus);
  EXPECT_EQ(c.dir, "/run");
  c = parse({"export", "/d", "--to", "m.pt"});
  EXPECT_EQ(c.kind, Command::Kind::kExport);
  EXPECT_EQ(c.to, "m.pt");
  EXPECT_FALSE(c.best);
  EXPECT_TRUE(parse({"export", "/d", "--best", "--to", "m.pt"}).best);
  c = parse({"plan", "r.yaml", "--memory-limit", "1GB", "--json"});
  EXPECT_EQ(c.kind, Command::Kind::kPlan);
  EXPECT_EQ(c.run.memory_limit, 1000000000);
  EXPECT_EQ(parse({"--version"}).kind, Command::Kind::kVersion);
  c = parse({"--help"});
  EXPECT_EQ(c.kind, Command::Kind::kHelp);
  // --help is made from the one option table: every option is in it.
  for (const OptionSpec& o : option_table()) {
    const std::string name = o.name;
    const std::string flag = "--" + name.substr(name.find(',') + 1);
    EXPECT_NE(c.help.find(flag), std::string::npos) << flag;
  }
}

TEST(CommandLine, QueueTakesItsFileTheDirectoryParallelAndRestarts) {
  const Command c =
      parse({"queue", "q.yaml", "--dir", "/q", "--parallel", "2", "--max-restarts", "3"});
  EXPECT_EQ(c.kind, Command::Kind::kQueue);
  EXPECT_EQ(c.config_path, "q.yaml");
  EXPECT_EQ(c.dir, "/q");
  EXPECT_EQ(c.parallel, 2);
  EXPECT_EQ(c.launch.max_restarts, 3);
  EXPECT_EQ(parse({"queue", "q.yaml", "--dir", "/q", "--hang-timeout", "30"}).launch.hang_timeout,
            30);
  EXPECT_EQ(parse({"queue", "q.yaml", "--dir", "/q"}).parallel, 1);
  EXPECT_NE(error_of({"queue", "q.yaml"}).find("--dir DIR"), std::string::npos);
  EXPECT_NE(error_of({"queue", "q.yaml", "--dir", "/q", "--parallel", "0"}).find("--parallel"),
            std::string::npos);
}

TEST(CommandLine, MistakesAreConfigErrorsThatSayWhatIsWrong) {
  EXPECT_NE(error_of({}).find("missing CONFIG.yaml"), std::string::npos);
  EXPECT_NE(error_of({"r.yaml"}).find("--ckpt DIR is required"), std::string::npos);
  EXPECT_NE(error_of({"r.yaml", "--ckpt", "d", "--resum"}).find("resum"), std::string::npos);
  EXPECT_NE(error_of({"r.yaml", "other.yaml", "--ckpt", "d"}).find("unexpected argument"),
            std::string::npos);
  EXPECT_NE(error_of({"ckpt", "lst", "d"}).find("list|verify|inspect"), std::string::npos);
  EXPECT_NE(error_of({"export", "d"}).find("--to PATH"), std::string::npos);
  EXPECT_NE(error_of({"export", "d", "--to", "x", "--format", "gguf"}).find("pt, hf or peft"),
            std::string::npos);
  EXPECT_NE(
      error_of({"export", "d", "--to", "x", "--dtype", "bfloat16"}).find("--format hf and peft"),
      std::string::npos);
  EXPECT_NE(error_of({"r.yaml", "--ckpt", "d", "--memory-limit", "12XB"}).find("invalid size"),
            std::string::npos);
  EXPECT_NE(error_of({"r.yaml", "--ckpt", "d", "--max-restarts", "-1"}).find(">= 0"),
            std::string::npos);
  for (const std::string& e : {error_of({"r.yaml"}), error_of({"ckpt", "x", "d"})})
    EXPECT_NE(e.find("gpurun --help"), std::string::npos) << e;
  // Issue 31, item 8: cxxopts named the value but not the option.
  EXPECT_NE(error_of({"plan", "r.yaml", "--deadline", "abc"})
                .find("--deadline abc: expected a number (HOURS)"),
            std::string::npos)
      << error_of({"plan", "r.yaml", "--deadline", "abc"});
  EXPECT_NE(error_of({"r.yaml", "--ckpt", "d", "--max-restarts=two"})
                .find("--max-restarts two: expected a whole number (N)"),
            std::string::npos)
      << error_of({"r.yaml", "--ckpt", "d", "--max-restarts=two"});
}

TEST(StatusCommand, ACheckpointDirectoryWithoutStatusPointsAtTheRunDir) {
  test::TempDir dir("status");
  std::ostringstream out;
  try {
    status_command(dir.path(), false, out);
    FAIL() << "no status.json, no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no run in"), std::string::npos) << e.what();
  }
  std::filesystem::create_directory(dir / "ckpt-e0000-s0000010");
  std::ofstream(dir / "LATEST") << "ckpt-e0000-s0000010";
  try {
    status_command(dir.path(), false, out);
    FAIL() << "no status.json, no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--run-dir"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gpurun

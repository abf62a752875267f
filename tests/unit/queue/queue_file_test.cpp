// QUEUE.yaml (queue/queue_file.h), the queue's state file and the device and command-line
// helpers of the scheduler (queue/queue_runner.h), on real files in a temporary directory.
#include "queue/queue_file.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "gpurun/errors.h"
#include "queue/queue_runner.h"
#include "queue/queue_state.h"
#include "queue/queue_summary.h"
#include "queue/run_child.h"
#include "util/fs.h"

namespace gpurun {
namespace {

using test::TempDir;

class QueueFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpurun::fs::write_file(dir_ / "run.yaml", "train: {epochs: 1}\n");
    gpurun::fs::make_dirs(dir_ / "sub");
    gpurun::fs::write_file(dir_ / "sub/other.yaml", "train: {epochs: 1}\n");
  }
  QueueFile parse(const std::string& text) {
    return parse_queue_text(text, "q.yaml", dir_.path(), /*check_files=*/true);
  }
  /// The ConfigError's message for `text`; fails the test when it parses.
  std::string error_of(const std::string& text) {
    try {
      parse(text);
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << "parsed: " << text;
    return "";
  }
  TempDir dir_{"queue"};
};

TEST_F(QueueFileTest, SeedsMakeOneRunEachWithTrainSeedLast) {
  const QueueFile q = parse("config: run.yaml\nset: [train.epochs=3]\nseeds: [1, 2, 3]\n");
  ASSERT_EQ(q.runs.size(), 3u);
  EXPECT_EQ(q.runs[0].name, "seed-1");
  EXPECT_EQ(q.runs[2].name, "seed-3");
  EXPECT_EQ(q.runs[1].config_path, dir_ / "run.yaml");
  EXPECT_EQ(q.runs[1].sets, (std::vector<std::string>{"train.epochs=3", "train.seed=2"}));
  EXPECT_EQ(q.runs[1].seed, 2);
}

TEST_F(QueueFileTest, RunsTakeTheirOwnConfigSetsAndNamesAfterTheQueuesSets) {
  const QueueFile q = parse(
      "config: run.yaml\nset: train.epochs=2\nruns:\n"
      "  - {config: sub/other.yaml, set: [optim.lr=0.1], name: lr-0.1}\n"
      "  - {seed: 5}\n"
      "  - {config: sub/../run.yaml}\n");
  ASSERT_EQ(q.runs.size(), 3u);
  EXPECT_EQ(q.runs[0].name, "lr-0.1");
  EXPECT_EQ(q.runs[0].config_path, dir_ / "sub/other.yaml");
  EXPECT_EQ(q.runs[0].sets, (std::vector<std::string>{"train.epochs=2", "optim.lr=0.1"}));
  EXPECT_EQ(q.runs[1].name, "run-seed-5");
  EXPECT_EQ(q.runs[1].sets, (std::vector<std::string>{"train.epochs=2", "train.seed=5"}));
  EXPECT_EQ(q.runs[2].name, "run");
  EXPECT_EQ(q.runs[2].config_path, dir_ / "run.yaml");  // lexically normal
  EXPECT_FALSE(q.runs[2].seed.has_value());
}

TEST_F(QueueFileTest, RepeatedDerivedNamesGetTheirPosition) {
  const QueueFile q =
      parse("runs:\n  - {config: run.yaml}\n  - {config: run.yaml, set: [a.b=1]}\n");
  ASSERT_EQ(q.runs.size(), 2u);
  EXPECT_EQ(q.runs[0].name, "run-1");
  EXPECT_EQ(q.runs[1].name, "run-2");
}

TEST_F(QueueFileTest, AConfigAloneIsAQueueOfOneRun) {
  const QueueFile q = parse("config: run.yaml\nset: [train.epochs=2]\n");
  ASSERT_EQ(q.runs.size(), 1u);
  EXPECT_EQ(q.runs[0].name, "run");
}

TEST_F(QueueFileTest, StopCommandIsAStringAndATypoOfItIsNamed) {
  EXPECT_EQ(parse("config: run.yaml\nseeds: [1]\nstop_command: sudo poweroff\n").stop_command,
            "sudo poweroff");
  EXPECT_EQ(parse("config: run.yaml\nseeds: [1]\n").stop_command, "");
  const std::string typo = error_of("config: run.yaml\nseeds: [1]\nstop_comand: poweroff\n");
  EXPECT_NE(typo.find("did you mean stop_command?"), std::string::npos) << typo;
  const std::string list = error_of("config: run.yaml\nseeds: [1]\nstop_command: [a]\n");
  EXPECT_NE(list.find("stop_command must be a non-empty string"), std::string::npos) << list;
}

TEST_F(QueueFileTest, UnknownKeysAreNamedWithTheKeyTheyMeant) {
  const std::string top = error_of("config: run.yaml\nseed: [1, 2]\n");
  EXPECT_NE(top.find("unknown key seed"), std::string::npos) << top;
  EXPECT_NE(top.find("did you mean seeds?"), std::string::npos) << top;
  EXPECT_NE(top.find("q.yaml:2"), std::string::npos) << top;
  const std::string run = error_of("runs:\n  - {config: run.yaml, nmae: x}\n");
  EXPECT_NE(run.find("unknown key nmae in runs[0]"), std::string::npos) << run;
  EXPECT_NE(run.find("did you mean name?"), std::string::npos) << run;
  const std::string far = error_of("config: run.yaml\nseeds: [1]\nbanana: 1\n");
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
}

TEST_F(QueueFileTest, BadValuesAreConfigErrorsNamingTheKey) {
  EXPECT_NE(error_of("config: missing.yaml\nseeds: [1]\n").find("does not exist"),
            std::string::npos);
  EXPECT_NE(error_of("config: run.yaml\nseeds: [one]\n").find("seeds must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of("config: run.yaml\nseeds: 3\n").find("seeds must be a list"),
            std::string::npos);
  EXPECT_NE(error_of("config: run.yaml\nset: [train.epochs]\n").find("KEY=VALUE"),
            std::string::npos);
  EXPECT_NE(error_of("config: run.yaml\nset: [=3]\n").find("KEY=VALUE"), std::string::npos);
  EXPECT_NE(error_of("runs: [{set: [a=1]}]\n").find("has no config"), std::string::npos);
  EXPECT_NE(error_of("seeds: [1]\n").find("needs a config"), std::string::npos);
  EXPECT_NE(error_of("runs:\n  - {config: run.yaml, name: ../x}\n").find("must be a file name"),
            std::string::npos);
  EXPECT_NE(error_of("config: [a, b]\n").find("config must be a non-empty string"),
            std::string::npos);
  EXPECT_NE(error_of("runs: {config: run.yaml}\n").find("runs must be a list"), std::string::npos);
}

TEST_F(QueueFileTest, EmptyQueuesAndDuplicateNamesAreRefused) {
  EXPECT_NE(error_of("").find("must be a mapping"), std::string::npos);
  EXPECT_NE(error_of("set: [a=1]\n").find("defines no runs"), std::string::npos);
  EXPECT_NE(error_of("config: run.yaml\nseeds: []\n").find("defines no runs"), std::string::npos);
  EXPECT_NE(error_of("config: run.yaml\nseeds: [1]\nruns: [{name: seed-1}]\n")
                .find("two runs are named seed-1"),
            std::string::npos);
  EXPECT_NE(error_of("config: run.yaml\nseeds: [1\n").find("not valid YAML"), std::string::npos);
}

TEST_F(QueueFileTest, ASeedListedTwiceNamesBothEntries) {
  // One line, two places: the message must tell them apart (it named the same line twice).
  const std::string flow = error_of("config: run.yaml\nseeds: [1, 2, 1]\n");
  EXPECT_NE(flow.find("seeds lists 1 twice"), std::string::npos) << flow;
  EXPECT_NE(flow.find("1st entry (q.yaml:2:9)"), std::string::npos) << flow;
  EXPECT_NE(flow.find("3rd (q.yaml:2:15)"), std::string::npos) << flow;
  const std::string block = error_of("config: run.yaml\nseeds:\n  - 5\n  - 6\n  - 5\n");
  EXPECT_NE(block.find("(q.yaml:3:5)"), std::string::npos) << block;
  EXPECT_NE(block.find("(q.yaml:5:5)"), std::string::npos) << block;
}

TEST_F(QueueFileTest, ANegativeSeedIsNamedWithAnM) {
  const QueueFile q =
      parse("config: run.yaml\nseeds: [-1, 1]\nruns:\n  - {config: sub/other.yaml, seed: -12}\n");
  ASSERT_EQ(q.runs.size(), 3u);
  EXPECT_EQ(q.runs[0].name, "seed-m1");
  EXPECT_EQ(q.runs[0].sets.back(), "train.seed=-1");
  EXPECT_EQ(q.runs[1].name, "seed-1");
  EXPECT_EQ(q.runs[2].name, "other-seed-m12");
}

TEST_F(QueueFileTest, LoadResolvesConfigsFromTheQueueFilesFolder) {
  gpurun::fs::write_file(dir_ / "sub/q.yaml", "config: other.yaml\nseeds: [7]\n");
  const QueueFile q = load_queue_file(dir_ / "sub/q.yaml");
  ASSERT_EQ(q.runs.size(), 1u);
  EXPECT_EQ(q.runs[0].config_path, dir_ / "sub/other.yaml");
  EXPECT_EQ(q.path, dir_ / "sub/q.yaml");
  EXPECT_THROW(load_queue_file(dir_ / "none.yaml"), ConfigError);
  // A relative queue file is kept absolute: queue.json and `gpurun status` name it from
  // anywhere (they showed "sub/q.yaml").
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(::chdir(dir_.path().c_str()), 0);
  QueueFile relative;
  try {
    relative = load_queue_file("sub/./q.yaml");
  } catch (...) {
    ASSERT_EQ(::chdir(cwd), 0);
    throw;
  }
  ASSERT_EQ(::chdir(cwd), 0);
  EXPECT_EQ(relative.path, dir_ / "sub/q.yaml");
  EXPECT_EQ(relative.runs.at(0).config_path, dir_ / "sub/other.yaml");
}

TEST(QueueFile, TheExampleQueueParses) {
  const QueueFile q = load_queue_file(std::string(GPURUN_SOURCE_DIR) + "/examples/queue.yaml");
  ASSERT_EQ(q.runs.size(), 4u);
  EXPECT_EQ(q.runs[3].name, "lr-3e-3");
  EXPECT_EQ(q.runs[3].config_path, std::string(GPURUN_SOURCE_DIR) + "/examples/fashion_mnist.yaml");
  EXPECT_EQ(q.runs[3].sets,
            (std::vector<std::string>{"train.epochs=3", "optim.lr=0.003", "train.seed=1"}));
}

TEST(QueueState, RoundTripsThroughQueueJson) {
  TempDir dir("queue-state");
  EXPECT_FALSE(read_queue_state(dir.path()).has_value());
  QueueState s;
  s.queue_file = "q.yaml";
  s.parallel = 2;
  RunRecord r;
  r.name = "seed-1";
  r.seed = 1;
  r.config = "/x/run.yaml";
  r.sets = {"train.seed=1"};
  r.queue_sets = {"train.threads=1"};
  r.state = RunState::kInterrupted;
  r.exit_code = 75;
  r.restarts = 1;
  r.wall_seconds = 2.5;
  s.runs.push_back(r);
  write_queue_state(dir.path(), s);
  const std::optional<QueueState> back = read_queue_state(dir.path());
  ASSERT_TRUE(back.has_value());
  ASSERT_EQ(back->runs.size(), 1u);
  EXPECT_EQ(back->parallel, 2);
  EXPECT_EQ(back->runs[0].name, "seed-1");
  EXPECT_EQ(back->runs[0].seed, 1);
  EXPECT_EQ(back->runs[0].state, RunState::kInterrupted);
  EXPECT_EQ(back->runs[0].queue_sets, r.queue_sets);
  EXPECT_EQ(back->runs[0].exit_code, 75);
  EXPECT_DOUBLE_EQ(back->runs[0].wall_seconds, 2.5);
  gpurun::fs::write_file(dir / "queue.json", "{\"format_version\": 9}");
  EXPECT_THROW(read_queue_state(dir.path()), Error);
}

TEST(QueueState, AFinishedRunIsKnownByItsOwnDoneEvent) {
  TempDir dir("queue-metrics");
  EXPECT_FALSE(read_run_metrics(dir.path()).done_exit_code.has_value());
  gpurun::fs::write_file(dir / "metrics.jsonl",
                         "{\"event\":\"epoch\",\"epoch\":0,\"eval_loss\":1.5}\n"
                         "{\"event\":\"done\",\"exit_code\":75}\n"
                         "{\"epoch\":1,\"event\":\"epoch\",\"eval_loss\":0.5}\n"
                         "{\"event\":\"done\",\"exit_code\":0}\n{\"event\":\"do");  // cut line
  const RunMetrics m = read_run_metrics(dir.path());
  EXPECT_EQ(m.done_exit_code, 0);
  ASSERT_TRUE(m.last_epoch.has_value());
  EXPECT_EQ((*m.last_epoch)["epoch"], 1);
}

// A run directory copied elsewhere keeps a status.json naming the old place: its own LATEST
// says its checkpoints are its own. Without one, the status names the --ckpt of a --run-dir.
TEST(QueueState, TheCheckpointDirectoryIsTheRunDirectoryWhenItHoldsALatest) {
  TempDir dir;
  const std::string run = dir / "copy";
  gpurun::fs::make_dirs(run);
  gpurun::fs::write_file(run + "/status.json",
                         R"({"last_checkpoint": "/elsewhere/exp1/ckpt-e0001-s0000010"})");
  EXPECT_EQ(checkpoint_dir_of(run), "/elsewhere/exp1");
  gpurun::fs::write_file(run + "/LATEST", "ckpt-e0001-s0000010\n");
  EXPECT_EQ(checkpoint_dir_of(run), run);
  EXPECT_EQ(checkpoint_dir_of(dir / "none"), dir / "none");
}

TEST(QueueSummary, RowsTakeTheLastEpochAndUnknownValuesStayEmpty) {
  TempDir dir("queue-summary");
  QueueState s;
  RunRecord done;
  done.name = "seed-1";
  done.seed = 1;
  done.state = RunState::kFinished;
  done.exit_code = 0;
  done.attempts = 1;
  done.wall_seconds = 61;
  RunRecord bad;
  bad.name = "typo";
  bad.state = RunState::kFailed;
  bad.exit_code = 2;
  bad.attempts = 1;
  s.runs = {done, bad};
  gpurun::fs::make_dirs(dir / "runs/seed-1");
  gpurun::fs::write_file(dir / "runs/seed-1/metrics.jsonl",
                         "{\"event\":\"epoch\",\"epoch\":0,\"eval_loss\":2.0}\n"
                         "{\"event\":\"epoch\",\"epoch\":1,\"train_loss\":0.75,"
                         "\"eval_loss\":0.5,\"eval_accuracy\":0.875}\n");
  const std::vector<SummaryRow> rows = summary_rows(dir.path(), s);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].epochs, 2);
  EXPECT_DOUBLE_EQ(rows[0].eval_loss, 0.5);
  write_summary(dir.path(), rows);
  EXPECT_EQ(gpurun::fs::read_file(dir / "summary.csv"),
            "run,seed,state,exit_code,restarts,wall_seconds,epochs,train_loss,eval_loss,"
            "eval_accuracy\n"
            "seed-1,1,finished,0,0,61.000,2,0.75,0.5,0.875\n"
            "typo,,failed,2,0,0.000,0,,,\n");
  const nlohmann::json j = nlohmann::json::parse(gpurun::fs::read_file(dir / "summary.json"));
  EXPECT_EQ(j["finished"], 1);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_TRUE(j["runs"][1]["eval_loss"].is_null());
  std::ostringstream table;
  print_summary_table(rows, table);
  EXPECT_NE(table.str().find("seed-1  1     finished     0         0  1m01s"), std::string::npos)
      << table.str();
  EXPECT_NE(table.str().find("0.8750"), std::string::npos) << table.str();
}

TEST(QueueRunner, CudaDevicesComeFromTheVariableElseFromDev) {
  EXPECT_EQ(cuda_devices({{"CUDA_VISIBLE_DEVICES", "2, 3"}}), (std::vector<std::string>{"2", "3"}));
  EXPECT_EQ(cuda_devices({{"CUDA_VISIBLE_DEVICES", "0,-1,1"}}), std::vector<std::string>{"0"});
  EXPECT_TRUE(cuda_devices({{"CUDA_VISIBLE_DEVICES", ""}}).empty());
  TempDir dev("queue-dev");
  for (const char* name : {"nvidia10", "nvidia2", "nvidiactl", "nvidia-uvm", "null"})
    gpurun::fs::write_file(dev / name, "");
  EXPECT_EQ(cuda_devices({}, dev.path()), (std::vector<std::string>{"2", "10"}));
}

TEST(QueueRunner, EachRunResumesInItsOwnDirectory) {
  EXPECT_EQ(run_argv("/bin/gpurun", "/q", "seed-1", "/c/run.yaml", {"train.seed=1"}),
            (std::vector<std::string>{"/bin/gpurun", "run", "/c/run.yaml", "--ckpt",
                                      "/q/runs/seed-1", "--resume", "--set", "train.seed=1"}));
}

}  // namespace
}  // namespace gpurun

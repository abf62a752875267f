// Bring-your-own data and models end to end with the real binary (issue 6): the csv, text and
// synthetic datasets, the resnet and gpt models, the sample printed after each epoch, and an
// exact kill-and-resume of a character-level GPT on real text (Debian's bible-kjv-text).
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

const std::string kBible = "/usr/bin/bible";  // bible-kjv (pulled in by bible-kjv-text)

/// The King James Bible as plain text, one verse a line (4.3 MB, ASCII), written into `dir`
/// with Debian's `bible` program, as scripts/install-deps.sh does for examples/char_lm.yaml.
std::string kjv_text(const TempDir& dir) {
  Result r = run_program({kBible, "-l100000", "Gen1:1-Rev22:21"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(r.out.size(), 4000000u);
  const std::string path = dir / "kjv.txt";
  std::ofstream(path, std::ios::binary) << r.out;
  return path;
}

/// Two Gaussian blobs per class in 4 dimensions, string labels, a header; `bad_line` (1-based,
/// > 1) replaced by a row with a missing field when not 0.
std::string blobs_csv(const TempDir& dir, int rows, int bad_line = 0) {
  std::mt19937 rng(5);
  std::normal_distribution<double> noise(0.0, 1.0);
  const char* names[] = {"circle", "square", "triangle"};
  std::ostringstream out;
  out << "w,x,y,z,shape\n";
  for (int i = 0; i < rows; ++i) {
    if (i + 2 == bad_line) {
      out << "1.0,2.0,3.0,circle\n";
      continue;
    }
    const int c = i % 3;
    for (int d = 0; d < 4; ++d) out << (d == c ? 3.0 : 0.0) + noise(rng) << ",";
    out << names[c] << "\n";
  }
  const std::string path = dir / "shapes.csv";
  std::ofstream(path) << out.str();
  return path;
}

/// gpurun `args`, started from the working directory `cwd`.
Result run_gpurun_in(const std::string& cwd, const std::vector<std::string>& args) {
  std::vector<std::string> argv{"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", cwd, GPURUN_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv, 300);
}

const char* const kCsvModel =
    "model: {name: mlp, hidden: [16]}\noptim: {name: adam, lr: 0.01}\n"
    "train: {epochs: 1, batch_size: 32, threads: 1}\n";

// Issue 31, item 8: data.path resolved against the working directory while model.plugin,
// model.torchscript and model.init_from resolved against run.yaml's folder. One rule now: an
// input is read from beside run.yaml, and every error names the path it tried.
TEST(Paths, ARelativeDataPathIsReadFromBesideRunYamlWhereverGpurunIsStarted) {
  TempDir dir;
  std::filesystem::create_directories(dir / "cfg");
  std::filesystem::create_directories(dir / "work");
  TempDir data_dir;
  std::filesystem::copy_file(blobs_csv(data_dir, 300), dir / "cfg/shapes.csv");
  const std::string config = write_config(
      dir, std::string(kCsvModel) + "data: {name: csv, path: shapes.csv, label: shape}\n",
      "cfg/run.yaml");
  const Result r = run_gpurun_in(dir / "work", {config, "--ckpt", dir / "ckpt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(events(dir / "ckpt", "epoch").size(), 1u);
  // The config keeps what was written: its hash does not depend on where the run started.
  EXPECT_EQ(inspect(dir / "ckpt")["config"]["data"]["path"], "shapes.csv");
  // A missing input is named by the path that was tried.
  const std::string missing = write_config(
      dir, std::string(kCsvModel) + "data: {name: csv, path: none.csv, eval_path: e.csv}\n",
      "cfg/missing.yaml");
  const Result m = run_gpurun_in(dir / "work", {missing, "--ckpt", dir / "m"});
  EXPECT_EQ(m.exit_code, 2) << m.err;
  EXPECT_TRUE(contains(m.err, dir / "cfg/none.csv")) << m.err;
}

// A run started when data.path resolved against the working directory resumes from that
// directory: a relative path found only there is still read from there, with a warning; found
// in both places it is refused, naming both (never a silent change of data).
TEST(Paths, ARunWhoseRelativeDataPathIsInTheWorkingDirectoryStillResumesFromIt) {
  TempDir dir;
  std::filesystem::create_directories(dir / "cfg");
  std::filesystem::create_directories(dir / "work/data");
  TempDir data_dir;
  std::filesystem::copy_file(blobs_csv(data_dir, 300), dir / "work/data/shapes.csv");
  const std::string config = write_config(
      dir, std::string(kCsvModel) + "data: {name: csv, path: data/shapes.csv, label: shape}\n",
      "cfg/run.yaml");
  const Result first = run_gpurun_in(dir / "work", {config, "--ckpt", dir / "ckpt"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_TRUE(contains(first.err, "as older gpurun did")) << first.err;
  EXPECT_TRUE(contains(first.err, dir / "work/data/shapes.csv")) << first.err;
  const std::string hash = inspect(dir / "ckpt").value("config_hash", "");
  const Result resumed = run_gpurun_in(
      dir / "work", {config, "--ckpt", dir / "ckpt", "--resume", "--set", "train.epochs=2"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(events(dir / "ckpt", "resume").size(), 1u);
  EXPECT_EQ(events(dir / "ckpt", "epoch").size(), 2u);
  EXPECT_EQ(inspect(dir / "ckpt").value("config_hash", ""), hash);
  // Another file of that name beside run.yaml: which one is meant is not guessed.
  std::filesystem::create_directories(dir / "cfg/data");
  std::ofstream(dir / "cfg/data/shapes.csv") << "w,x,y,z,shape\n1,2,3,4,circle\n";
  const Result both = run_gpurun_in(
      dir / "work", {config, "--ckpt", dir / "ckpt", "--resume", "--set", "train.epochs=3"});
  EXPECT_EQ(both.exit_code, 2) << both.err;
  EXPECT_TRUE(contains(both.err, dir / "cfg/data/shapes.csv")) << both.err;
  EXPECT_TRUE(contains(both.err, dir / "work/data/shapes.csv")) << both.err;
}

TEST(DataCsv, MalformedRowExitsTwoNamingFileAndLine) {
  TempDir dir;
  const std::string csv = blobs_csv(dir, 50, 17);
  const std::string config =
      write_config(dir, "model: {name: mlp, hidden: [16]}\ndata: {name: csv, path: " + csv +
                            ", label: shape}\ntrain: {threads: 1}\n");
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, csv + ":17: 4 fields, expected 5")) << r.err;
}

TEST(DataCsv, TrainsEndToEndWithStringLabels) {
  TempDir dir;
  const std::string config = write_config(dir,
                                          "model: {name: mlp, hidden: [32]}\n"
                                          "data: {name: csv, path: " +
                                              blobs_csv(dir, 600) +
                                              ", label: shape, eval_fraction: 0.2}\n"
                                              "optim: {name: adam, lr: 0.01}\n"
                                              "train: {epochs: 3, batch_size: 32, threads: 1}\n");
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto epochs = events(dir / "ckpt", "epoch");
  ASSERT_EQ(epochs.size(), 3u);
  EXPECT_GT(epochs.back()["eval_accuracy"].get<double>(), 0.9);
  EXPECT_LT(epochs.back()["train_loss"].get<double>(), epochs.front()["train_loss"].get<double>());
  const auto manifest = inspect(dir / "ckpt");
  EXPECT_EQ(manifest["extra"]["class_names"], nlohmann::json({"circle", "square", "triangle"}));
}

TEST(DataSynthetic, TrainsEndToEndOnTheSameDataEveryRun) {
  TempDir dir;
  const std::string config = write_config(
      dir,
      "model: {name: mlp, hidden: [64]}\n"
      "data: {name: synthetic, samples: 1280, shape: [1, 16, 16], classes: 4, seed: 3}\n"
      "optim: {name: adam, lr: 0.003}\n"
      "train: {epochs: 2, batch_size: 32, threads: 1}\n");
  Result r = run_gpurun({config, "--ckpt", dir / "a"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto epochs = events(dir / "a", "epoch");
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_GT(epochs.back()["eval_accuracy"].get<double>(), 0.8);
  EXPECT_LT(epochs.back()["eval_loss"].get<double>(), std::log(4.0) / 2);
  ASSERT_EQ(run_gpurun({config, "--ckpt", dir / "b"}).exit_code, 0);
  EXPECT_EQ(inspect(dir / "a").value("model_digest", ""),
            inspect(dir / "b").value("model_digest", ""));
}

TEST(ModelResnet, LearnsFashionMnist) {
  TempDir dir;
  const std::string config =
      write_config(dir,
                   "model: {name: resnet, channels: [16, 32], blocks: [1, 1]}\n"
                   "data: {name: idx, train_samples: 1024, eval_samples: 500}\n"
                   "optim: {name: adam, lr: 0.003}\n"
                   "train: {epochs: 3, batch_size: 32, threads: 1}\n");
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto epochs = events(dir / "ckpt", "epoch");
  ASSERT_EQ(epochs.size(), 3u);
  EXPECT_GT(epochs.back()["eval_accuracy"].get<double>(), 0.55);  // 10 classes: 0.1 by chance
  EXPECT_LT(epochs.back()["eval_loss"].get<double>(), epochs.front()["eval_loss"].get<double>());
}

/// examples/char_lm.yaml shrunk by `sets` for a test.
std::vector<std::string> char_lm(const std::string& text, const std::string& ckpt,
                                 std::vector<std::string> sets) {
  // One thread: on a busy 2-core machine, two OpenMP threads spin against other processes.
  sets.insert(sets.begin(), {"data.path=" + text, "train.threads=1"});
  return with_sets({std::string(GPURUN_SOURCE_DIR) + "/examples/char_lm.yaml", "--ckpt", ckpt},
                   sets);
}

TEST(CharLm, LossFallsOverAShortEpochAndASampleIsPrinted) {
  if (access(kBible.c_str(), X_OK) != 0) GTEST_SKIP() << "apt-get install bible-kjv-text";
  TempDir dir;
  const std::string text = kjv_text(dir);
  Result r =
      run_gpurun(char_lm(text, dir / "ckpt",
                         {"model.layers=2", "model.width=32", "optim.lr=0.005", "train.epochs=1",
                          "data.train_samples=960", "data.eval_samples=100",
                          "schedule.warmup_steps=5", "log.every_steps=5", "sample.length=100"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto steps = events(dir / "ckpt", "step");
  ASSERT_GE(steps.size(), 5u);
  const double first = steps.front()["loss"], last = steps.back()["loss"];
  const auto epochs = events(dir / "ckpt", "epoch");
  ASSERT_EQ(epochs.size(), 1u);
  const double eval_loss = epochs[0]["eval_loss"];
  std::cerr << "char_lm: loss of the first 5 steps " << first << ", of the last 5 " << last
            << ", eval loss " << eval_loss << "\n";
  EXPECT_LT(last, first - 0.8);
  EXPECT_LT(eval_loss, 3.2);  // uniform over the 73 characters would be ln 73 = 4.29
  EXPECT_TRUE(contains(r.err, "sample after epoch 1")) << r.err;
  EXPECT_TRUE(contains(r.err, "And God said|")) << r.err;
  const auto manifest = inspect(dir / "ckpt");
  EXPECT_GT(manifest["extra"]["class_names"].size(), 60u);
}

TEST(CharLm, KillAndResumeGivesTheUninterruptedDigestAndSamplingChangesNothing) {
  if (access(kBible.c_str(), X_OK) != 0) GTEST_SKIP() << "apt-get install bible-kjv-text";
  TempDir dir;
  const std::string text = kjv_text(dir);
  // A tiny GPT with dropout, 2 epochs of 12 steps, a checkpoint every 5 steps.
  const std::vector<std::string> sets{
      "model.layers=2",         "model.width=32",         "model.heads=2",
      "data.context=32",        "data.train_samples=192", "data.eval_samples=32",
      "train.batch_size=16",    "train.epochs=2",         "checkpoint.every_steps=5",
      "checkpoint.async=false", "sample.length=40"};
  std::vector<std::string> no_sample(sets);
  no_sample.back() = "sample.length=0";
  Result full = run_gpurun(char_lm(text, dir / "full", sets));
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const std::string expected = inspect(dir / "full").value("model_digest", "");
  ASSERT_EQ(expected.size(), 16u);
  EXPECT_EQ(events(dir / "full", "epoch").size(), 2u);
  ASSERT_EQ(run_gpurun(char_lm(text, dir / "quiet", no_sample)).exit_code, 0);
  EXPECT_EQ(inspect(dir / "quiet").value("model_digest", ""), expected)
      << "printing a sample changed the training";

  // Killed in epoch 1 (global step 17), after the epoch-0 sample; resumed from step 15.
  Result killed =
      run_gpurun(char_lm(text, dir / "ckpt", sets), {{"GPURUN_FAULT", "sigkill:after_step:17"}});
  ASSERT_EQ(killed.signal, SIGKILL) << killed.err;
  EXPECT_EQ(inspect(dir / "ckpt").value("global_step", -1), 15);
  std::vector<std::string> resume = char_lm(text, dir / "ckpt", sets);
  resume.push_back("--resume");
  Result resumed = run_gpurun(resume);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(inspect(dir / "ckpt").value("model_digest", ""), expected);
}

// data.stage_dir (issue 11): the data set copied from "network storage" to a local disk,
// verified, reused while unchanged, copied again when the source or the copy changes.
TEST(DataStage, ACopyIsReusedWhileUnchangedAndCopiedAgainWhenItsSourceOrItselfChanges) {
  namespace fs = std::filesystem;
  TempDir dir;
  const std::string src = dir / "nas-data", stage = dir / "stage";
  fs::create_directories(src);
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator("/usr/share/datasets/fashion-mnist")) {
    fs::copy_file(e.path(), src + "/" + e.path().filename().string());
    total += static_cast<int64_t>(e.file_size());
  }
  const std::string config = write_config(dir, small_config(600, 40, 1));
  const std::vector<std::string> sets{"data.path=" + src, "data.stage_dir=" + stage};
  const auto staged = [&](const std::string& run) {
    Result r = run_gpurun(with_sets({config, "--ckpt", dir / run}, sets));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(contains(r.err, "staged data.path " + src)) << r.err;
    const auto plan = events(dir / run, "plan");
    EXPECT_EQ(plan.size(), 1u);
    return plan.empty() ? nlohmann::json() : plan.back()["data_stage"][0];
  };
  Result reference = run_gpurun({config, "--ckpt", dir / "reference", "--set", "data.path=" + src});
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const std::string digest = inspect(dir / "reference").value("model_digest", "");

  const nlohmann::json first = staged("first");
  EXPECT_EQ(first["files"], 4);
  EXPECT_EQ(first["bytes"], total);
  EXPECT_EQ(first["copied_files"], 4);
  EXPECT_EQ(first["copied_bytes"], total);
  const std::string copy = first.value("copy", "");
  ASSERT_EQ(copy.rfind(stage, 0), 0u) << copy;
  for (const auto& e : fs::directory_iterator(src))
    EXPECT_EQ(slurp(copy + "/" + e.path().filename().string()), slurp(e.path().string()));
  EXPECT_EQ(inspect(dir / "first").value("model_digest", ""), digest);

  EXPECT_EQ(staged("second")["copied_files"], 0);

  // The source changes: the same labels, compressed again (other bytes, the same data).
  const std::string labels = src + "/train-labels-idx1-ubyte.gz";
  Result regz = run_program({"/bin/sh", "-c",
                             "gzip -dc '" + labels + "' | gzip -1 -n > '" + labels +
                                 ".new' && mv '" + labels + ".new' '" + labels + "'"});
  ASSERT_EQ(regz.exit_code, 0) << regz.err;
  const nlohmann::json third = staged("third");
  EXPECT_EQ(third["copied_files"], 1);
  EXPECT_EQ(third["copied_bytes"], static_cast<int64_t>(fs::file_size(labels)));
  EXPECT_EQ(slurp(copy + "/train-labels-idx1-ubyte.gz"), slurp(labels));
  EXPECT_EQ(inspect(dir / "third").value("model_digest", ""), digest);

  // The local copy is damaged: found by its xxh3 and copied again.
  flip_byte(copy + "/t10k-labels-idx1-ubyte.gz", 100, 0x01);
  EXPECT_EQ(staged("fourth")["copied_files"], 1);
  EXPECT_EQ(slurp(copy + "/t10k-labels-idx1-ubyte.gz"), slurp(src + "/t10k-labels-idx1-ubyte.gz"));

  // A stage dir inside the source would grow with every start: refused, as is one that is a
  // file, naming the key.
  Result inside = run_gpurun(with_sets({config, "--ckpt", dir / "inside"},
                                       {"data.path=" + src, "data.stage_dir=" + src + "/stage"}));
  EXPECT_EQ(inside.exit_code, 2) << inside.err;
  EXPECT_TRUE(contains(inside.err, "is inside data.path")) << inside.err;
  Result onto_file = run_gpurun(with_sets({config, "--ckpt", dir / "file"},
                                          {"data.path=" + src, "data.stage_dir=" + labels}));
  EXPECT_EQ(onto_file.exit_code, 2) << onto_file.err;
  EXPECT_TRUE(contains(onto_file.err, "data.stage_dir")) << onto_file.err;

  // `gpurun plan` shows what staging did.
  Result plan = run_gpurun(with_sets({"plan", config}, sets));
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_TRUE(contains(plan.out, "data staged     " + copy)) << plan.out;
}

}  // namespace
}  // namespace gpurun::test

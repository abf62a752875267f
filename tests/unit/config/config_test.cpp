// Tests of run.yaml parsing, validation, --set overrides, the config hash and SIZE strings.
#include "gpurun/config.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "common/temp_dir.h"

#include "config/schema.h"
#include "gpurun/errors.h"

namespace gpurun {
namespace {

/// EXPECT_TRUE(contains(text, part)) prints both on failure (gmock is not linked here).
::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" is not in:\n" << text;
}

/// A temporary directory for config files, removed with its files at the end of the test.
class ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tmp_.path(); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  test::TempDir tmp_{"config"};
  std::string dir_;
};

/// The message of the ConfigError that parsing `yaml` (plus `overrides`) throws.
std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "run.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for:\n" << yaml;
  return "";
}

TEST(Config, DefaultsFromEmptyText) {
  const RunConfig c = parse_config("", "run.yaml");
  EXPECT_EQ(c.model.name, "cnn");
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(c.optim.name, "adam");
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.train.epochs, 1);
  EXPECT_EQ(c.train.batch_size, 64);
  EXPECT_EQ(c.checkpoint.keep_last, 3);
  EXPECT_EQ(c.log.every_steps, 10);
  EXPECT_EQ(c.source, "run.yaml");
  EXPECT_EQ(config_hash(c), config_hash(RunConfig{}));
  // Comments only is empty too.
  EXPECT_EQ(config_hash(parse_config("# nothing\n", "x")), config_hash(RunConfig{}));
}

TEST_F(ConfigFiles, FullValidFile) {
  const std::string path = write("run.yaml", R"(# every section
model:
  name: mlp
  hidden: [512, 256, 128]
  channels:
    - 16
    - 32
  dropout: 0.25
  batch_norm: true
data:
  name: idx
  path: /data/fashion
  train_samples: 6000
  eval_samples: 1000
optim:
  name: sgd
  lr: 1e-2
  momentum: 0.9
  nesterov: true
  weight_decay: 5e-4
  grad_clip: 1
schedule:
  name: cosine
  warmup_steps: 100
  min_lr: 0.0001
train:
  epochs: 3
  batch_size: 128
  accumulation_steps: 4
  seed: 7
  threads: 2
checkpoint:
  every_steps: 500
  every_minutes: 10
  keep_last: 2
log:
  every_steps: 5
)");
  const RunConfig c = load_config(path);
  EXPECT_EQ(c.model.name, "mlp");
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{512, 256, 128}));
  EXPECT_EQ(c.model.channels, (std::vector<int64_t>{16, 32}));
  EXPECT_DOUBLE_EQ(c.model.dropout, 0.25);
  EXPECT_TRUE(c.model.batch_norm);
  EXPECT_EQ(c.data.path, "/data/fashion");
  EXPECT_EQ(c.data.train_samples, 6000);
  EXPECT_EQ(c.optim.name, "sgd");
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.01);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 5e-4);
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 1.0);  // an int is a valid float
  EXPECT_TRUE(c.optim.nesterov);
  EXPECT_EQ(c.schedule.name, "cosine");
  EXPECT_EQ(c.schedule.warmup_steps, 100);
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_EQ(c.train.accumulation_steps, 4);
  EXPECT_EQ(c.train.threads, 2);
  EXPECT_DOUBLE_EQ(c.checkpoint.every_minutes, 10.0);
  EXPECT_EQ(c.log.every_steps, 5);
  EXPECT_EQ(c.source, path);

  const std::string block = format_resolved(c);
  EXPECT_TRUE(contains(block, "resolved config (" + path + "):\n"));
  EXPECT_TRUE(contains(block, "\n  optim.lr                     0.01\n"));
  EXPECT_TRUE(contains(block, "\n  model.hidden                 [512, 256, 128]\n"));
  EXPECT_LT(block.find("model.name"), block.find("log.every_steps"));  // schema order
}

TEST_F(ConfigFiles, EmptyFileIsAllDefaults) {
  const RunConfig c = load_config(write("empty.yaml", ""));
  EXPECT_EQ(config_hash(c), config_hash(RunConfig{}));
  EXPECT_EQ(c.train.epochs, 1);
}

TEST_F(ConfigFiles, MissingFile) {
  try {
    load_config(dir_ + "/absent.yaml");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot read " + dir_ + "/absent.yaml: No such file or directory");
  }
}

TEST(Config, TypoSuggestsKey) {
  const std::string msg = error_of("model:\n  name: mlp\ntrain:\n  epoch: 3\n");
  EXPECT_TRUE(contains(msg, "run.yaml:4:"));
  EXPECT_TRUE(contains(msg, "unknown key train.epoch"));
  EXPECT_TRUE(contains(msg, "did you mean train.epochs?"));
}

// Issue 44, part 3: keep_best and early_stop, their modes resolved by the metric, typos
// suggested, and not training keys (a resume may change them).
TEST(Config, KeepBestAndEarlyStopResolveAndSuggest) {
  const RunConfig defaults = parse_config("", "run.yaml");
  EXPECT_EQ(defaults.checkpoint.keep_best.metric, "");
  EXPECT_EQ(defaults.checkpoint.keep_best.k, 1);
  EXPECT_EQ(defaults.train.early_stop.patience, 3);
  const RunConfig c = parse_config(
      "checkpoint: {keep_best: {metric: eval_accuracy, k: 2}}\n"
      "train: {early_stop: {metric: eval_loss, patience: 4, min_delta: 0.01}}\n",
      "run.yaml");
  EXPECT_EQ(c.checkpoint.keep_best.mode, "max");  // auto: accuracy rises
  EXPECT_EQ(c.checkpoint.keep_best.k, 2);
  EXPECT_EQ(c.train.early_stop.mode, "min");  // auto: a loss falls
  EXPECT_EQ(c.train.early_stop.patience, 4);
  EXPECT_EQ(c.train.early_stop.min_delta, 0.01);
  EXPECT_EQ(
      parse_config("", "run.yaml",
                   {"checkpoint.keep_best.metric=train_loss", "checkpoint.keep_best.mode=max"})
          .checkpoint.keep_best.mode,
      "max");
  EXPECT_EQ(config_hash(defaults), config_hash(c));
  EXPECT_TRUE(contains(error_of("checkpoint:\n  keep_best: {metric: eval_los}\n"),
                       "did you mean eval_loss?"));
  EXPECT_TRUE(contains(error_of("train:\n  early_stop: {patiense: 3}\n"),
                       "unknown key train.early_stop.patiense; did you mean "
                       "train.early_stop.patience?"));
  EXPECT_TRUE(contains(error_of("checkpoint:\n  keep_best: {metric: eval_loss, k: 0}\n"),
                       "checkpoint.keep_best.k"));
}

// Issue 43: preemption.watch and poll_seconds, typos suggested, bad values named.
TEST(Config, PreemptionKeysAreCheckedAndSuggested) {
  const RunConfig defaults = parse_config("", "run.yaml");
  EXPECT_EQ(defaults.preemption.watch, "auto");
  EXPECT_EQ(defaults.preemption.poll_seconds, 5);
  const RunConfig c = parse_config("preemption:\n  watch: gcp\n  poll_seconds: 0.5\n", "run.yaml");
  EXPECT_EQ(c.preemption.watch, "gcp");
  EXPECT_EQ(c.preemption.poll_seconds, 0.5);
  EXPECT_TRUE(contains(error_of("preemption:\n  wacth: aws\n"),
                       "unknown key preemption.wacth; did you mean preemption.watch?"));
  EXPECT_TRUE(contains(error_of("preemtion:\n  watch: aws\n"), "did you mean preemption?"));
  const std::string bad = error_of("", {"preemption.watch=awz"});
  EXPECT_TRUE(contains(bad, "preemption.watch must be one of")) << bad;
  EXPECT_TRUE(contains(bad, "did you mean aws?")) << bad;
  EXPECT_EQ(error_of("preemption:\n  poll_seconds: 0\n"),
            "run.yaml:2: preemption.poll_seconds must be >= 0.1, got 0.0");
  // Not a training key: a resume may watch another cloud.
  EXPECT_EQ(config_hash(defaults), config_hash(c));
}

TEST(Config, KeyUnderWrongSectionSuggestsItsSection) {
  EXPECT_TRUE(contains(error_of("optim:\n  epochs: 3\n"), "did you mean train.epochs?"));
}

TEST(Config, PrefixSuggests) {
  EXPECT_TRUE(
      contains(error_of("schedule:\n  warmup: 10\n"), "did you mean schedule.warmup_steps?"));
}

TEST(Config, SwappedLettersAndCaseSuggest) {
  EXPECT_TRUE(contains(error_of("modle:\n  name: mlp\n"), "did you mean model?"));
  EXPECT_TRUE(contains(error_of("optim:\n  name: SGD\n"), "did you mean sgd?"));
}

TEST(Config, UnknownSectionListsSections) {
  const std::string msg = error_of("train:\n  epochs: 2\noptimizer:\n  lr: 0.1\n");
  EXPECT_TRUE(contains(msg, "run.yaml:3: unknown section optimizer"));
  EXPECT_TRUE(contains(msg, "did you mean optim?"));
  EXPECT_TRUE(contains(msg, "model, data, optim, schedule, train, checkpoint, memory, log"));
  EXPECT_TRUE(contains(error_of("zzz: 1\n"), "unknown section zzz (sections: model,"));
}

TEST(Config, FarOffKeyHasNoSuggestion) {
  const std::string msg = error_of("optim:\n  xyzzy_frobnicate: 1\n");
  EXPECT_TRUE(contains(msg, "unknown key optim.xyzzy_frobnicate (optim keys: name, lr,"));
  EXPECT_EQ(msg.find("did you mean"), std::string::npos);
}

TEST(Config, WrongType) {
  EXPECT_EQ(error_of("train:\n  epochs: 2\n  batch_size: abc\n"),
            "run.yaml:3: train.batch_size must be an integer, got \"abc\"");
  EXPECT_TRUE(contains(error_of("train:\n  epochs: 1.5\n"),
                       "run.yaml:2: train.epochs must be an integer, got 1.5"));
  EXPECT_TRUE(contains(error_of("train:\n  epochs: \"3\"\n"), "must be an integer, got \"3\""));
  EXPECT_TRUE(
      contains(error_of("optim:\n  lr: fast\n"), "optim.lr must be a number, got \"fast\""));
  EXPECT_TRUE(contains(error_of("model:\n  batch_norm: 1\n"),
                       "model.batch_norm must be true or false, got 1"));
  EXPECT_TRUE(contains(error_of("model:\n  hidden: 64\n"),
                       "model.hidden must be a non-empty list of integers"));
  EXPECT_TRUE(contains(error_of("model:\n  hidden: []\n"), "got []"));
  EXPECT_TRUE(
      contains(error_of("train:\n  epochs:\n"), "train.epochs must be an integer, got nothing"));
}

TEST(Config, SectionMustBeMapping) {
  EXPECT_TRUE(contains(error_of("train: 5\n"),
                       "run.yaml:1: section train must be a mapping of keys, got 5"));
  EXPECT_TRUE(contains(error_of("- a\n- b\n"), "run.yaml:1: expected a mapping of sections"));
}

TEST(Config, OutOfRangeNamesKeyValueAndLine) {
  EXPECT_EQ(error_of("# lr\n\noptim:\n  name: sgd\n\n\n  lr: -0.1\n"),
            "run.yaml:7: optim.lr must be > 0, got -0.1");
  EXPECT_EQ(error_of("optim:\n  momentum: 1\n"),
            "run.yaml:2: optim.momentum must be in [0, 1), got 1.0");
  EXPECT_EQ(error_of("train:\n  batch_size: 0\n"),
            "run.yaml:2: train.batch_size must be >= 1, got 0");
  // At most 1e9 epochs, so that the run's optimizer steps fit in 64 bits (9223372036854775807
  // epochs wrapped the step count around and trained for ever).
  EXPECT_EQ(error_of("train:\n  epochs: 0\n"),
            "run.yaml:2: train.epochs must be an integer from 1 to 1000000000, got 0");
  EXPECT_EQ(error_of("", {"train.epochs=9223372036854775807"}),
            "--set train.epochs=9223372036854775807: train.epochs must be an integer from 1 to "
            "1000000000, got 9223372036854775807");
  EXPECT_TRUE(contains(error_of("optim:\n  name: adamx\n"),
                       "optim.name must be one of sgd, adam, adamw, got \"adamx\"; did you mean"));
  EXPECT_TRUE(contains(error_of("model:\n  channels: [32, 0]\n"),
                       "model.channels must be a list of integers >= 1, got [32, 0]"));
}

TEST(Config, NumberTooLargeForItsTypeIsOutOfRangeWithTheRange) {
  EXPECT_EQ(error_of("", {"train.batch_size=99999999999999999999"}),
            "--set train.batch_size=99999999999999999999: train.batch_size is out of range: must "
            "be an integer from 1 to 9223372036854775807, got 99999999999999999999");
  EXPECT_EQ(error_of("train:\n  seed: -99999999999999999999\n"),
            "run.yaml:2: train.seed is out of range: must be an integer from "
            "-9223372036854775808 to 9223372036854775807, got -99999999999999999999");
  EXPECT_EQ(error_of("", {"model.hidden=[64, 99999999999999999999]"}),
            "--set model.hidden=[64, 99999999999999999999]: model.hidden is out of range: must "
            "be a list of integers from 1 to 9223372036854775807, got [64, 99999999999999999999]");
  EXPECT_EQ(error_of("", {"optim.lr=1e999"}),
            "--set optim.lr=1e999: optim.lr is out of range of a double (0, or magnitudes "
            "2.2e-308 to 1.8e308), got 1e999");
  // The ends of int64_t still fit; a fraction is still a wrong type.
  EXPECT_EQ(parse_config("", "r", {"train.seed=9223372036854775807"}).train.seed, INT64_MAX);
  EXPECT_EQ(parse_config("", "r", {"train.seed=-9223372036854775808"}).train.seed, INT64_MIN);
  EXPECT_TRUE(contains(error_of("", {"train.epochs=99999999999999999999.5"}),
                       "train.epochs must be an integer, got 99999999999999999999.5"));
}

TEST(Config, AllErrorsReportedAtOnce) {
  const std::string msg = error_of("optim:\n  lr: 0\ntrain:\n  epochs: 0\n");
  EXPECT_TRUE(contains(msg, "run.yaml:2: optim.lr"));
  EXPECT_TRUE(contains(msg, "run.yaml:4: train.epochs"));
}

TEST(Config, DuplicateKey) {
  EXPECT_TRUE(contains(error_of("train:\n  epochs: 2\n  epochs: 3\n"),
                       "run.yaml:3: duplicate key train.epochs (first set at run.yaml:2)"));
}

TEST(Config, FloatsInYamlForms) {
  const RunConfig c = parse_config("optim:\n  lr: 1e-3\n  eps: 1.0e-6\n  beta2: .99\n", "r");
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optim.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.99);
  EXPECT_TRUE(contains(error_of("optim:\n  lr: .nan\n"), "optim.lr must be a number"));
}

TEST(Config, SetTwiceLastWins) {
  const RunConfig c = parse_config("train:\n  epochs: 5\n", "run.yaml",
                                   {"train.epochs=2", "optim.lr=0.01", "train.epochs=7"});
  EXPECT_EQ(c.train.epochs, 7);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.01);
  // A bad file value that an override replaces is not an error.
  EXPECT_EQ(parse_config("train:\n  epochs: 0\n", "r", {"train.epochs=4"}).train.epochs, 4);
}

TEST(Config, SetList) {
  const RunConfig c = parse_config("", "run.yaml", {"model.hidden=[64,32]", "data.path=/x/y z"});
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(c.data.path, "/x/y z");
}

TEST(Config, SetErrors) {
  EXPECT_EQ(error_of("", {"train.epoch=3"}),
            "--set train.epoch=3: unknown key train.epoch; did you mean train.epochs?");
  EXPECT_EQ(error_of("", {"train.epochs=abc"}),
            "--set train.epochs=abc: train.epochs must be an integer, got \"abc\"");
  EXPECT_TRUE(contains(error_of("", {"train.epochs"}), "--set train.epochs: expected KEY=VALUE"));
  EXPECT_TRUE(contains(error_of("", {"model.hidden=[64,"}), "--set model.hidden=[64,: invalid"));
  EXPECT_TRUE(contains(error_of("", {"epochs=3"}), "did you mean train.epochs?"));
  EXPECT_TRUE(contains(error_of("", {"=3"}), "--set =3: expected KEY=VALUE"));
  EXPECT_EQ(parse_config("", "r", {" train.epochs = 2"}).train.epochs, 2);
}

TEST(Config, NesterovNeedsMomentum) {
  const std::string msg = error_of("optim:\n  name: sgd\n  nesterov: true\n");
  EXPECT_TRUE(contains(msg, "run.yaml:3:"));
  EXPECT_TRUE(contains(msg, "optim.nesterov"));
  EXPECT_TRUE(contains(msg, "optim.momentum > 0"));
  EXPECT_NO_THROW(parse_config("optim:\n  nesterov: true\n  momentum: 0.9\n", "r"));
}

TEST(Config, BatchDivisibleByAccumulation) {
  const std::string msg = error_of("train:\n  batch_size: 100\n", {"train.accumulation_steps=3"});
  EXPECT_TRUE(contains(msg, "--set train.accumulation_steps=3"));
  EXPECT_TRUE(contains(msg, "train.batch_size must be divisible by train.accumulation_steps"));
  EXPECT_TRUE(contains(msg, "got 100 and 3"));
  EXPECT_TRUE(contains(msg, "run.yaml:2"));  // where batch_size came from
  EXPECT_NO_THROW(parse_config("train:\n  batch_size: 96\n  accumulation_steps: 3\n", "r"));
}

TEST(Config, HashStableAndOnlyOverTrainingKeys) {
  const RunConfig base = parse_config("optim:\n  lr: 0.001\n", "a.yaml");
  EXPECT_EQ(config_hash(base), config_hash(parse_config("optim:\n  lr: 0.001\n", "b.yaml")));
  EXPECT_EQ(config_hash(base).size(), 16u);
  for (const char* unhashed :
       {"train.epochs=9", "checkpoint.keep_last=1", "checkpoint.every_steps=5",
        "checkpoint.lease_timeout=5", "log.every_steps=1", "train.threads=3"}) {
    EXPECT_EQ(config_hash(base), config_hash(parse_config("", "a.yaml", {unhashed}))) << unhashed;
  }
  const RunConfig faster = parse_config("", "a.yaml", {"optim.lr=0.01"});
  EXPECT_NE(config_hash(base), config_hash(faster));
  EXPECT_NE(config_hash(base), config_hash(parse_config("", "a", {"model.hidden=[256]"})));
  EXPECT_EQ(changed_training_keys(base, faster),
            (std::vector<std::string>{"optim.lr: 0.001 -> 0.01"}));
  EXPECT_TRUE(changed_training_keys(base, parse_config("", "a", {"train.epochs=4"})).empty());

  const std::vector<std::string> keys = training_keys();
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
  EXPECT_EQ(std::count(keys.begin(), keys.end(), "optim.lr"), 1);
  EXPECT_EQ(std::count(keys.begin(), keys.end(), "train.batch_size"), 1);
  EXPECT_EQ(std::count(keys.begin(), keys.end(), "train.epochs"), 0);
  for (const std::string& k : keys) {
    EXPECT_NE(k.rfind("checkpoint.", 0), 0u) << k;
    EXPECT_NE(k.rfind("log.", 0), 0u) << k;
  }
}

TEST(Config, EveryMinutesTakesANumberOrAutoAndAutoSurvivesTheManifest) {
  const RunConfig c =
      parse_config("checkpoint:\n  every_minutes: auto\n  mtbf_hours: 2\n", "run.yaml", {});
  EXPECT_TRUE(std::isnan(c.checkpoint.every_minutes));
  EXPECT_DOUBLE_EQ(c.checkpoint.mtbf_hours, 2);
  EXPECT_TRUE(contains(format_resolved(c), "every_minutes"));
  const nlohmann::json j = config_to_json(c);
  EXPECT_EQ(j["checkpoint"]["every_minutes"], "auto");
  EXPECT_TRUE(std::isnan(config_from_json(j).checkpoint.every_minutes));
  EXPECT_DOUBLE_EQ(
      parse_config("", "run.yaml", {"checkpoint.every_minutes=7.5"}).checkpoint.every_minutes, 7.5);
  EXPECT_TRUE(contains(error_of("checkpoint:\n  every_minutes: atuo\n"),
                       "checkpoint.every_minutes must be a number >= 0 or auto, got \"atuo\"; "
                       "did you mean auto?"));
  EXPECT_TRUE(contains(error_of("checkpoint:\n  every_minutes: -1\n"),
                       "checkpoint.every_minutes must be a number >= 0 or auto, got -1"));
  EXPECT_TRUE(contains(error_of("checkpoint:\n  mtbf_hours: 0\n"), "checkpoint.mtbf_hours"));
}

TEST(Config, JsonRoundTrip) {
  const RunConfig c = parse_config(
      "model:\n  name: mlp\n  hidden: [7, 5]\n  dropout: 0.1\noptim:\n  lr: 3e-4\n"
      "checkpoint:\n  every_minutes: 2.5\n",
      "run.yaml", {"train.epochs=4", "data.path=/d"});
  const nlohmann::json j = config_to_json(c);
  EXPECT_EQ(j["model"]["name"], "mlp");
  EXPECT_EQ(j["model"]["hidden"], nlohmann::json({7, 5}));
  EXPECT_EQ(j["train"]["epochs"], 4);
  const RunConfig back = config_from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(config_to_json(back), j);
  EXPECT_EQ(config_hash(back), config_hash(c));
  EXPECT_DOUBLE_EQ(back.checkpoint.every_minutes, 2.5);

  // Missing keys take defaults (older manifests); unknown keys are ignored.
  const RunConfig old = config_from_json({{"optim", {{"lr", 0.5}, {"future", 1}}}, {"new", 1}});
  EXPECT_DOUBLE_EQ(old.optim.lr, 0.5);
  EXPECT_EQ(old.train.batch_size, 64);
  EXPECT_THROW(config_from_json({{"optim", {{"lr", "x"}}}}), ConfigError);
  EXPECT_THROW(config_from_json({{"optim", 3}}), ConfigError);
  EXPECT_THROW(config_from_json(nlohmann::json::array()), ConfigError);
}

TEST(Config, YamlSyntaxErrorHasLine) {
  const std::string msg = error_of("train:\n  epochs: 2\n  batch_size: [1, 2\nlog:\n  x: 1\n");
  EXPECT_EQ(msg.rfind("run.yaml:", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "invalid YAML"));
  const int line = std::stoi(msg.substr(std::string("run.yaml:").size()));
  EXPECT_GE(line, 3);
  EXPECT_LE(line, 5);
}

TEST(Config, KeysDocumented) {
  const std::string keys = format_config_keys();
  EXPECT_TRUE(contains(keys, "optim.name (default adam; one of sgd, adam, adamw): "));
  EXPECT_TRUE(contains(keys, "optim.lr (default 0.001; > 0): learning rate\n"));
}

}  // namespace
}  // namespace gpurun

namespace gpurun {
namespace {
// yaml-cpp's Node assignment writes through to the referenced node: replacing one setting must
// leave every other value of the same flow mapping as written.
TEST(Config, OverrideKeepsTheOtherValuesOfItsSection) {
  const RunConfig c = parse_config(
      "train: {epochs: 1, batch_size: 30, eval_batch_size: 200, seed: 7, threads: 1}\n", "run.yaml",
      {"train.epochs=2", "train.seed=9", "train.epochs=3"});
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_EQ(c.train.batch_size, 30);
  EXPECT_EQ(c.train.eval_batch_size, 200);
  EXPECT_EQ(c.train.seed, 9);
  EXPECT_EQ(c.train.threads, 1);
}
// --- model.plugin and model.torchscript (issue 6) ----------------------------------------

TEST_F(ConfigFiles, PluginAndTorchScriptPathsResolveAgainstTheConfigsDirectory) {
  const RunConfig c =
      load_config(write("run.yaml", "model:\n  plugin: build/../lib/libx.so\n  name: x\n"));
  EXPECT_EQ(c.model.plugin, "build/../lib/libx.so");  // as written: what config_hash covers
  EXPECT_EQ(config_path(c, c.model.plugin), dir_ + "/lib/libx.so");
  EXPECT_EQ(config_path(c, "/abs/libx.so"), "/abs/libx.so");
  EXPECT_EQ(config_path(c, ""), "");
  const RunConfig ts = load_config(write("ts.yaml", "model:\n  torchscript: model.pt\n"));
  EXPECT_EQ(config_path(ts, ts.model.torchscript), dir_ + "/model.pt");
  // From text (no file), relative paths stay relative to the current directory.
  EXPECT_EQ(config_path(parse_config("", "x"), "a/b.so"), "a/b.so");
}

TEST(Config, TorchScriptSetsTheModelName) {
  const RunConfig c = parse_config("model:\n  torchscript: m.pt\n", "run.yaml");
  EXPECT_EQ(c.model.name, "torchscript");
  EXPECT_EQ(parse_config("", "x", {"model.torchscript=m.pt", "model.name=torchscript"}).model.name,
            "torchscript");
  EXPECT_TRUE(contains(error_of("model:\n  name: mlp\n  torchscript: m.pt\n"),
                       "model.name must be torchscript (or left out), got mlp"));
  EXPECT_TRUE(contains(error_of("model:\n  name: torchscript\n"),
                       "model.name: torchscript needs model.torchscript: FILE"));
}

TEST(Config, PluginNeedsAModelNameAndExcludesTorchScript) {
  EXPECT_TRUE(contains(error_of("model:\n  plugin: libx.so\n"),
                       "run.yaml:2: model.plugin is set, so model.name must name one of the "
                       "plugin's models"));
  EXPECT_TRUE(contains(error_of("model:\n  plugin: libx.so\n  torchscript: m.pt\n"),
                       "model.plugin and model.torchscript exclude each other"));
  const RunConfig c = parse_config("model:\n  plugin: libx.so\n  name: tiny\n", "run.yaml");
  EXPECT_EQ(c.model.name, "tiny");
  // Both keys change what is learned, and survive the manifest's JSON.
  EXPECT_NE(config_hash(c),
            config_hash(parse_config("model:\n  name: tiny\n  plugin: liby.so\n", "run.yaml")));
  EXPECT_EQ(config_hash(config_from_json(config_to_json(c))), config_hash(c));
  const auto keys = training_keys();
  EXPECT_NE(std::find(keys.begin(), keys.end(), "model.plugin"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "model.torchscript"), keys.end());
}

}  // namespace
}  // namespace gpurun

namespace gpurun {
namespace {

// Rules between the keys of the built-in models and datasets (issue 6).
TEST(Config, ModelAndDataRulesNameKeysValuesAndLines) {
  std::string msg =
      error_of("model:\n  name: gpt\n  width: 100\n  heads: 3\ndata:\n  name: text\n");
  EXPECT_TRUE(contains(msg, "run.yaml:3"));
  EXPECT_TRUE(contains(msg, "model.width must be divisible by model.heads, got 100 and 3"));

  msg = error_of("model: {name: gpt, context: 32}\ndata: {name: text, context: 64}\n");
  EXPECT_TRUE(contains(msg, "model.context 32 is shorter than data.context 64"));

  msg = error_of("model: {name: resnet, channels: [8, 16, 32]}\n");
  EXPECT_TRUE(
      contains(msg, "model.blocks must have one entry per stage of model.channels, got 2 and 3"));

  msg = error_of("model: {name: mlp}\ndata: {name: text}\n");
  EXPECT_TRUE(contains(msg, "model.name mlp takes float features"));
  msg = error_of("model: {name: gpt}\ndata: {name: synthetic}\n");
  EXPECT_TRUE(contains(msg, "use data.name text"));

  // data.name tokens (issue 30): its keys checked, misspelt ones named.
  msg = error_of("model: {name: mlp}\ndata: {name: tokens}\n");
  EXPECT_TRUE(contains(msg, "data.name tokens gives token ids; use model.name gpt"));
  msg = error_of("model: {name: gpt, context: 32}\ndata: {name: tokens, context: 64}\n");
  EXPECT_TRUE(contains(msg, "model.context 32 is shorter than data.context 64"));
  EXPECT_TRUE(contains(error_of("data: {name: tokens, windows: randm}\n"), "random"));
  EXPECT_TRUE(contains(error_of("data: {name: tokens, dtype: int16}\n"), "uint16"));
  EXPECT_TRUE(contains(error_of("data: {name: tokens, vocab_size: -1}\n"), "data.vocab_size"));
  EXPECT_TRUE(contains(error_of("data: {name: tokens, vocab_sise: 256}\n"),
                       "did you mean data.vocab_size?"));

  msg = error_of("data: {name: csv, delimiter: ';;'}\n");
  EXPECT_TRUE(contains(msg, "data.delimiter must be one character"));
  msg = error_of("data: {name: csv, header: false, label: species}\n");
  EXPECT_TRUE(contains(msg, "data.label \"species\" names a column, but data.header is false"));
  msg = error_of("data: {eval_fraction: 0}\n");
  EXPECT_TRUE(contains(msg, "data.eval_fraction must be in (0, 1), got 0"));  // 0 or 0.0

  const RunConfig ok = parse_config(
      "model: {name: gpt, context: 128}\ndata: {name: text, context: 64}\n"
      "sample: {prompt: 'And God said', temperature: 0.8}\n",
      "r");
  EXPECT_EQ(ok.sample.prompt, "And God said");
  EXPECT_EQ(ok.sample.length, 200);
}

TEST(Config, SampleKeysAreNotHashedAndTheLossIs) {
  const RunConfig base = parse_config("", "r");
  EXPECT_EQ(config_hash(base), config_hash(parse_config("sample: {length: 0, seed: 4}\n", "r")));
  EXPECT_NE(config_hash(base), config_hash(parse_config("train: {loss: hinge}\n", "r")));
}

}  // namespace
}  // namespace gpurun

namespace gpurun {
namespace {

TEST(Config, FineTuningKeysNestLoraAndTakeListsOfPatterns) {
  const RunConfig c = parse_config(
      "model:\n"
      "  name: gpt\n"
      "  freeze: [\"embed.*\", \"head.*\"]\n"
      "  init_from: base.pt\n"
      "  lora: {rank: 8, alpha: 16, targets: [\"*.attention.*\"]}\n"
      "data: {name: text}\n"
      "train: {precision: bf16}\n",
      "run.yaml", {"model.lora.dropout=0.05"});
  EXPECT_EQ(c.model.freeze, (std::vector<std::string>{"embed.*", "head.*"}));
  EXPECT_EQ(c.model.lora.rank, 8);
  EXPECT_EQ(c.model.lora.alpha, 16);
  EXPECT_EQ(c.model.lora.dropout, 0.05);
  EXPECT_EQ(c.model.lora.targets, (std::vector<std::string>{"*.attention.*"}));
  EXPECT_EQ(c.train.precision, "bf16");
  // The manifest's JSON nests the group and reads back to the same config.
  const nlohmann::json j = config_to_json(c);
  EXPECT_EQ(j["model"]["lora"]["rank"], 8);
  EXPECT_EQ(config_hash(config_from_json(j)), config_hash(c));
  // init_from is where the weights start, not what is learned; precision and LoRA are.
  RunConfig other = c;
  other.model.init_from = "elsewhere.pt";
  EXPECT_EQ(config_hash(other), config_hash(c));
  other.model.lora.rank = 4;
  EXPECT_NE(config_hash(other), config_hash(c));
  other = c;
  other.train.precision = "fp16";
  EXPECT_NE(config_hash(other), config_hash(c));
}

TEST(Config, FineTuningKeyErrorsNameTheKeyAndSuggest) {
  const auto message = [](const std::string& yaml, std::vector<std::string> sets = {}) {
    try {
      parse_config(yaml, "run.yaml", sets);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("model: {lora: {rnak: 8}}\n")
                .find("unknown key model.lora.rnak; did you "
                      "mean model.lora.rank?"),
            std::string::npos)
      << message("model: {lora: {rnak: 8}}\n");
  EXPECT_NE(message("train: {precision: bf61}\n").find("did you mean bf16?"), std::string::npos);
  EXPECT_NE(message("model: {freeze: embed}\n").find("model.freeze must be a list of strings"),
            std::string::npos)
      << message("model: {freeze: embed}\n");
  EXPECT_NE(message("", {"model.lora.targets=[]"}).find("non-empty list of strings"),
            std::string::npos);
  // A group given a value is named as a group, with its keys.
  EXPECT_NE(message("model: {lora: 8}\n")
                .find("model.lora is a group of keys (rank, alpha, dropout, targets), not a value"),
            std::string::npos)
      << message("model: {lora: 8}\n");
  EXPECT_NE(message("", {"model.lora=8"}).find("--set model.lora.rank=..."), std::string::npos);
  // One bare pattern is a list of one.
  EXPECT_EQ(parse_config("", "run.yaml", {"model.freeze=block0.*"}).model.freeze,
            (std::vector<std::string>{"block0.*"}));
}

}  // namespace
}  // namespace gpurun

namespace gpurun {
namespace {

/// The README's run.yaml reference: the YAML block after "Every key with its default".
std::string readme_reference() {
  std::ifstream in(std::string(GPURUN_SOURCE_DIR) + "/README.md");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t heading = text.find("Every key with its default");
  const size_t begin = text.find("```yaml\n", heading);
  const size_t end = text.find("\n```", begin + 8);
  if (heading == std::string::npos || begin == std::string::npos || end == std::string::npos)
    return "";
  return text.substr(begin + 8, end - begin - 8);
}

/// The dotted keys the block writes, by indentation ("model:" then "  lora:" then
/// "    rank: 0" is model.lora.rank), leaves only.
std::vector<std::string> written_keys(const std::string& block) {
  std::vector<std::pair<size_t, std::string>> open;  // indentation, name
  std::vector<std::string> keys;
  std::istringstream lines(block);
  for (std::string line; std::getline(lines, line);) {
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || line[indent] == '#') continue;
    const size_t colon = line.find(':', indent);
    if (colon == std::string::npos) continue;
    while (!open.empty() && open.back().first >= indent) open.pop_back();
    std::string name;
    for (const auto& [i, part] : open) name += part + ".";
    name += line.substr(indent, colon - indent);
    const std::string rest = line.substr(colon + 1);
    const size_t value = rest.find_first_not_of(' ');
    if (value == std::string::npos || rest[value] == '#')
      open.emplace_back(indent, line.substr(indent, colon - indent));  // a section
    else
      keys.push_back(name);
  }
  return keys;
}

// Issue 40, item 4: the README lists every key of run.yaml with its default. Parsed by
// gpurun's own parser (an unknown key there is an error naming it), it equals the defaults,
// and it writes exactly the schema's keys, so that a key added to one and not the other fails
// here.
TEST(ReadmeReference, ListsEveryKeyOfTheSchemaWithItsDefault) {
  const std::string block = readme_reference();
  ASSERT_FALSE(block.empty()) << "no run.yaml reference block in README.md";
  const nlohmann::json written = config_to_json(parse_config(block, "README.md", {}));
  const nlohmann::json defaults = config_to_json(RunConfig{});
  for (const auto& [section, keys] : defaults.items()) {
    if (!keys.is_object()) continue;
    for (const auto& [key, value] : keys.items())
      EXPECT_EQ(written[section][key], value) << section << "." << key;
  }
  std::vector<std::string> in_readme = written_keys(block), in_schema;
  for (const auto& key : detail::schema()) in_schema.emplace_back(key.name);
  std::sort(in_readme.begin(), in_readme.end());
  std::sort(in_schema.begin(), in_schema.end());
  std::vector<std::string> missing, extra;
  std::set_difference(in_schema.begin(), in_schema.end(), in_readme.begin(), in_readme.end(),
                      std::back_inserter(missing));
  std::set_difference(in_readme.begin(), in_readme.end(), in_schema.begin(), in_schema.end(),
                      std::back_inserter(extra));
  EXPECT_TRUE(missing.empty()) << "keys of the schema the README does not list: "
                               << nlohmann::json(missing).dump();
  EXPECT_TRUE(extra.empty()) << "keys the README lists that the schema lacks: "
                             << nlohmann::json(extra).dump();
}

}  // namespace
}  // namespace gpurun

// User plugins (issue 6) with the real binary: a plugin built in the test tree (tests/plugin)
// trains its own model on its own dataset and resumes exactly; plugins that do not fit are
// refused with exit 3, naming the versions or the symbol.
#include <signal.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "gpurun/plugin.h"
#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;

/// test_mlp on test_blobs from `plugin`: 2 epochs x 16 steps, a synchronous checkpoint every 4.
std::string plugin_config(const std::string& plugin) {
  return "model: {plugin: " + plugin +
         ", name: test_mlp, hidden: [32]}\n"
         "data: {name: test_blobs, train_samples: 512, eval_samples: 128}\n"
         "optim: {name: sgd, lr: 0.05, momentum: 0.9}\n"
         "train: {epochs: 2, batch_size: 32, seed: 3, threads: 1}\n"
         "checkpoint: {every_steps: 4, async: false}\n"
         "log: {every_steps: 4}\n";
}

TEST(Plugin, TrainsItsModelOnItsDatasetAndResumesAfterSigkillToTheSameDigest) {
  TempDir dir;
  // A relative model.plugin resolves against the run.yaml's directory, not the working one.
  fs::create_directories(dir / "plugins");
  fs::copy_file(GPURUN_TEST_PLUGIN, dir / "plugins/libtest.so");
  const std::string config = write_config(dir, plugin_config("plugins/libtest.so"));

  Result full = run_gpurun({config, "--ckpt", dir / "full"});
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_TRUE(contains(full.err, "loaded plugin " + (dir / "plugins/libtest.so"))) << full.err;
  const nlohmann::json manifest = inspect(dir / "full");
  const std::string expected = manifest.value("model_digest", "");
  ASSERT_EQ(expected.size(), 16u);
  EXPECT_EQ(manifest["global_step"], 32);
  const nlohmann::json source = manifest["extra"]["model_source"];
  EXPECT_EQ(source["kind"], "plugin");
  EXPECT_EQ(source["path"], dir / "plugins/libtest.so");
  EXPECT_EQ(source["abi_version"], GPURUN_PLUGIN_ABI_VERSION);
  EXPECT_EQ(manifest["config"]["model"]["plugin"], "plugins/libtest.so");
  // The plugin's model learned the plugin's data: the clusters are well separated.
  const auto epochs = events(dir / "full", "epoch");
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_GT(epochs.back()["eval_accuracy"].get<double>(), 0.9);
  EXPECT_LT(epochs.back()["train_loss"].get<double>(), epochs.front()["train_loss"].get<double>());

  // Killed after step 10 (the checkpoint of step 8 is complete: saves are synchronous).
  const std::vector<std::string> args{config, "--ckpt", dir / "ckpt", "--resume"};
  Result killed = run_gpurun(args, {{"GPURUN_FAULT", "sigkill:after_step:10"}});
  ASSERT_EQ(killed.signal, SIGKILL) << "exit " << killed.exit_code << "\n" << killed.err;
  Result resumed = run_gpurun(args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto resumes = events(dir / "ckpt", "resume");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_EQ(resumes[0]["global_step"], 8);
  EXPECT_EQ(inspect(dir / "ckpt").value("model_digest", ""), expected);
  // The interrupted epoch's train loss covers the whole epoch, as without the kill.
  const auto resumed_epochs = events(dir / "ckpt", "epoch");
  ASSERT_EQ(resumed_epochs.size(), 2u);
  EXPECT_DOUBLE_EQ(resumed_epochs[0]["train_loss"].get<double>(),
                   epochs[0]["train_loss"].get<double>());
}

TEST(Plugin, AnotherAbiVersionExits3NamingBothVersions) {
  TempDir dir;
  const std::string config = write_config(dir, plugin_config(GPURUN_TEST_PLUGIN_WRONG_ABI));
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, GPURUN_TEST_PLUGIN_WRONG_ABI)) << r.err;
  EXPECT_TRUE(contains(
      r.err, "built for plugin ABI version " + std::to_string(GPURUN_PLUGIN_ABI_VERSION + 1) +
                 ", but this gpurun has ABI version " + std::to_string(GPURUN_PLUGIN_ABI_VERSION)))
      << r.err;
  EXPECT_FALSE(fs::exists(dir / "ckpt")) << "refused before anything was written";
}

TEST(Plugin, AMissingEntryPointExits3NamingTheSymbolAndTheFile) {
  TempDir dir;
  const std::string config = write_config(dir, plugin_config(GPURUN_TEST_PLUGIN_NO_INIT));
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, std::string("model.plugin ") + GPURUN_TEST_PLUGIN_NO_INIT +
                                  " has no symbol gpurun_plugin_init"))
      << r.err;
}

TEST(Plugin, AnUnknownModelNameListsThePluginsModels) {
  TempDir dir;
  const std::string config = write_config(dir, plugin_config(GPURUN_TEST_PLUGIN));
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt", "--set", "model.name=test_mpl"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(
      r.err, "model.name: unknown name \"test_mpl\"; did you mean test_mlp?; registered: "))
      << r.err;
}

// A plugin's model and dataset under DDP: 2 ranks stopped by SIGTERM after step 10 resume to
// the digest of an uninterrupted 2-rank run.
TEST(Plugin, TrainsWithTwoRanksAndResumesToTheSameDigest) {
  TempDir dir;
  const std::string config = write_config(dir, plugin_config(GPURUN_TEST_PLUGIN));
  Result full = run_gpurun({config, "--ckpt", dir / "full", "--nproc-per-node", "2"});
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_EQ(inspect(dir / "full")["world_size"], 2);
  const std::vector<std::string> args{config,     "--ckpt",           dir / "ckpt",
                                      "--resume", "--nproc-per-node", "2"};
  Result stopped = run_gpurun(args, {{"GPURUN_FAULT", "sigterm:after_step:10"}});
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  Result resumed = run_gpurun(args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(events(dir / "ckpt", "resume").size(), 1u);
  EXPECT_EQ(inspect(dir / "ckpt").value("model_digest", ""),
            inspect(dir / "full").value("model_digest", ""));
}

}  // namespace
}  // namespace gpurun::test

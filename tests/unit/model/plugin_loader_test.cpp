// Tests of loading plugin .so files (plugin.h, plugin_loader.h) with the plugins of tests/plugin.
#include "model/plugin_loader.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/plugin.h"
#include "gpurun/registry.h"

namespace gpurun {
namespace {

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" is not in:\n" << text;
}

/// The message of the exception of type E that loading `path` throws.
template <typename E>
std::string error_of(const std::string& path) {
  Registry registry;
  try {
    load_plugin(path, registry);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "another exception than expected: " << e.what();
    return "";
  }
  ADD_FAILURE() << "loading " << path << " did not throw";
  return "";
}

TEST(PluginLoader, RegistersTheTestPluginsModelAndDataset) {
  Registry registry;
  const PluginInfo info = load_plugin(GPURUN_TEST_PLUGIN, registry);
  EXPECT_EQ(info.abi_version, GPURUN_PLUGIN_ABI_VERSION);
  EXPECT_EQ(info.torch_version, TORCH_VERSION);
  const auto models = registry.model_names();
  EXPECT_NE(std::find(models.begin(), models.end(), "test_mlp"), models.end());
  const auto datasets = registry.dataset_names();
  EXPECT_NE(std::find(datasets.begin(), datasets.end(), "test_blobs"), datasets.end());

  DataConfig data;
  data.name = "test_blobs";
  const DatasetSplits splits = registry.make_dataset(data);
  EXPECT_EQ(splits.train->size(), 512);
  EXPECT_EQ(splits.input_shape, (std::vector<int64_t>{8}));
  ModelConfig config;
  config.name = "test_mlp";
  config.hidden = {16};
  auto model = registry.make_model(config, splits.input_shape, splits.num_classes);
  EXPECT_EQ(model->segment_names(), (std::vector<std::string>{"body", "head"}));
  EXPECT_EQ(model->forward(at::zeros({3, 8})).sizes(), (std::vector<int64_t>{3, 4}));
  // A model made by the plugin's code checkpoints and digests like a built-in one.
  EXPECT_EQ(state_dict(*model).size(), 4u);
  EXPECT_EQ(model_digest(*model).size(), 16u);
}

TEST(PluginLoader, AnotherAbiVersionIsRefusedNamingBoth) {
  const std::string message = error_of<AbiError>(GPURUN_TEST_PLUGIN_WRONG_ABI);
  EXPECT_TRUE(contains(message, GPURUN_TEST_PLUGIN_WRONG_ABI));
  EXPECT_TRUE(contains(
      message, "built for plugin ABI version " + std::to_string(GPURUN_PLUGIN_ABI_VERSION + 1)));
  EXPECT_TRUE(contains(message,
                       "this gpurun has ABI version " + std::to_string(GPURUN_PLUGIN_ABI_VERSION)));
}

TEST(PluginLoader, AMissingEntryPointIsNamed) {
  const std::string message = error_of<AbiError>(GPURUN_TEST_PLUGIN_NO_INIT);
  EXPECT_TRUE(contains(message, GPURUN_TEST_PLUGIN_NO_INIT));
  EXPECT_TRUE(contains(message, "has no symbol gpurun_plugin_init"));
}

TEST(PluginLoader, ALibraryThatIsNoPluginNamesTheVersionSymbol) {
  const std::string libz = "/lib/x86_64-linux-gnu/libz.so.1";
  if (access(libz.c_str(), R_OK) != 0) GTEST_SKIP() << "no " << libz;
  EXPECT_TRUE(contains(error_of<AbiError>(libz), "has no symbol gpurun_plugin_abi_version"));
}

TEST(PluginLoader, AFileThatIsNoLibraryGivesDlopensMessage) {
  char tmpl[] = "/tmp/gpurun-plugin-XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(tmpl) << "not an ELF file, but long enough to have a header to read and reject\n";
  const std::string message = error_of<ConfigError>(tmpl);
  std::remove(tmpl);
  EXPECT_TRUE(contains(message, std::string("model.plugin: cannot load ") + tmpl + ": "));
  EXPECT_TRUE(contains(message, "invalid ELF header"));
  EXPECT_TRUE(contains(error_of<ConfigError>("/nonexistent/libx.so"),
                       "model.plugin: no such file: /nonexistent/libx.so"));
}

TEST(PluginLoader, ConfiguredPluginIsLoadedFromTheConfigsDirectory) {
  Registry registry;
  RunConfig config;
  load_configured_plugin(config, registry);  // none configured: nothing happens
  EXPECT_EQ(registry.model_names().size(), 0u);
  const std::string plugin = GPURUN_TEST_PLUGIN;
  config.base_dir = plugin.substr(0, plugin.rfind('/'));
  config.model.plugin = plugin.substr(plugin.rfind('/') + 1);
  load_configured_plugin(config, registry);
  EXPECT_EQ(registry.model_names(), (std::vector<std::string>{"test_mlp"}));
  config.model.plugin = "missing.so";
  config.source = "/some/run.yaml";
  try {
    load_configured_plugin(config, registry);
    ADD_FAILURE() << "no error for a missing plugin";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "no such file: " + config.base_dir +
                                       "/missing.so (missing.so, "
                                       "relative to the directory of /some/run.yaml)"));
  }
}

TEST(PluginLoader, ModelSourceRecordsTheFileAndWarnsWhenItChanges) {
  RunConfig config;
  EXPECT_TRUE(describe_model_source(config).empty());
  config.model.plugin = GPURUN_TEST_PLUGIN;
  const nlohmann::json plugin = describe_model_source(config);
  EXPECT_EQ(plugin["kind"], "plugin");
  EXPECT_EQ(plugin["path"], GPURUN_TEST_PLUGIN);
  EXPECT_EQ(plugin["abi_version"], GPURUN_PLUGIN_ABI_VERSION);
  EXPECT_EQ(plugin["xxh3"].get<std::string>().size(), 16u);
  EXPECT_EQ(compare_model_source(plugin, plugin), "");
  EXPECT_EQ(compare_model_source(nlohmann::json::object(), plugin), "");
  config.model.plugin = GPURUN_TEST_PLUGIN_NO_INIT;  // another file
  const std::string changed = compare_model_source(plugin, describe_model_source(config));
  EXPECT_TRUE(contains(changed, "is not the file the checkpoint was trained with"));
  EXPECT_TRUE(contains(changed, "xxh3 " + plugin["xxh3"].get<std::string>() + " -> "));
}

}  // namespace
}  // namespace gpurun

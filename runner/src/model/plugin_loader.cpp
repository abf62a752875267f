#include "model/plugin_loader.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "gpurun/errors.h"
#include "gpurun/plugin.h"
#include "util/fs.h"
#include "util/hash.h"

namespace gpurun {
namespace {

using json = nlohmann::json;

const char* const kAbiSymbol = "gpurun_plugin_abi_version";
const char* const kTorchSymbol = "gpurun_plugin_torch_version";
const char* const kInitSymbol = "gpurun_plugin_init";
const char* const kHowToBuild =
    "; a gpurun plugin defines its entry points with GPURUN_PLUGIN(registry) { ... } from "
    "<gpurun/plugin.h> (see examples/custom_plugin)";

/// "undefined symbol: _ZN6gpurun3fooEv" -> "... (gpurun::foo())", when it demangles.
std::string with_demangled(const std::string& message) {
  const std::string key = "undefined symbol: ";
  const size_t at = message.find(key);
  if (at == std::string::npos) return message;
  const size_t begin = at + key.size();
  const size_t end = message.find_first_of(" ,\n", begin);
  const std::string mangled = message.substr(begin, end == std::string::npos ? end : end - begin);
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), &std::free);
  return status == 0 && name ? message + " (" + name.get() + ")" : message;
}

/// "1.13.0" -> "1.13".
std::string major_minor(const std::string& version) {
  const size_t dot = version.find('.');
  return dot == std::string::npos ? version : version.substr(0, version.find('.', dot + 1));
}

std::string file_digest(const std::string& path, const char* key) {
  try {
    return xxh3_hex(fs::read_file(path));
  } catch (const IoError& e) {
    throw ConfigError(std::string(key) + ": cannot read " + path + ": " + e.what());
  }
}

}  // namespace

PluginInfo load_plugin(const std::string& path, Registry& registry) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw ConfigError("model.plugin: no such file: " + path);
  // RTLD_LOCAL: the plugin's own symbols stay out of the global namespace, so two plugins, or a
  // plugin and gpurun, never bind to each other's helpers by accident. RTLD_NOW: a symbol the
  // plugin needs but this gpurun lacks fails here, with its name, not in the middle of a run.
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const std::string error = dlerror();
    if (error.find("undefined symbol") != std::string::npos)
      throw AbiError("model.plugin " + path +
                     " needs a symbol this gpurun does not have; it was "
                     "built against other gpurun or LibTorch headers, rebuild it: " +
                     with_demangled(error));
    throw ConfigError("model.plugin: cannot load " + path + ": " + error);
  }
  const auto symbol = [&](const char* name) { return dlsym(handle, name); };

  PluginInfo info;
  info.path = path;
  auto abi = reinterpret_cast<int (*)()>(symbol(kAbiSymbol));
  if (!abi) throw AbiError("model.plugin " + path + " has no symbol " + kAbiSymbol + kHowToBuild);
  info.abi_version = abi();
  if (info.abi_version != GPURUN_PLUGIN_ABI_VERSION)
    throw AbiError("model.plugin " + path + " was built for plugin ABI version " +
                   std::to_string(info.abi_version) + ", but this gpurun has ABI version " +
                   std::to_string(GPURUN_PLUGIN_ABI_VERSION) +
                   "; rebuild the plugin against this gpurun's headers");
  if (auto torch_version = reinterpret_cast<const char* (*)()>(symbol(kTorchSymbol))) {
    info.torch_version = torch_version();
    if (major_minor(info.torch_version) != major_minor(TORCH_VERSION))
      throw AbiError("model.plugin " + path + " was built against LibTorch " + info.torch_version +
                     ", but this gpurun uses LibTorch " + TORCH_VERSION +
                     "; rebuild the plugin against the same LibTorch");
  }
  auto init = reinterpret_cast<int (*)(int, Registry*)>(symbol(kInitSymbol));
  if (!init) throw AbiError("model.plugin " + path + " has no symbol " + kInitSymbol + kHowToBuild);
  int status = 0;
  try {
    status = init(GPURUN_PLUGIN_ABI_VERSION, &registry);
  } catch (const std::exception& e) {
    throw ConfigError("model.plugin " + path + ": registering its models failed: " + e.what());
  }
  if (status != 0)
    throw AbiError("model.plugin " + path + ": " + kInitSymbol + "(" +
                   std::to_string(GPURUN_PLUGIN_ABI_VERSION) + ", registry) returned " +
                   std::to_string(status));
  spdlog::info("loaded plugin {} (plugin ABI {}, LibTorch {})", path, info.abi_version,
               info.torch_version.empty() ? "not stated" : info.torch_version);
  return info;
}

void load_configured_plugin(const RunConfig& config, Registry& registry) {
  if (config.model.plugin.empty()) return;
  const std::string path = config_path(config, config.model.plugin);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw ConfigError("model.plugin: no such file: " + path +
                      (path == config.model.plugin
                           ? ""
                           : " (" + config.model.plugin + ", relative to the directory of " +
                                 config.source + ")"));
  load_plugin(path, registry);
}

nlohmann::json describe_model_source(const RunConfig& config) {
  json source = json::object();
  if (!config.model.plugin.empty()) {
    const std::string path = config_path(config, config.model.plugin);
    source = {{"kind", "plugin"},
              {"path", path},
              {"xxh3", file_digest(path, "model.plugin")},
              {"abi_version", GPURUN_PLUGIN_ABI_VERSION}};
  } else if (!config.model.torchscript.empty()) {
    const std::string path = config_path(config, config.model.torchscript);
    source = {
        {"kind", "torchscript"}, {"path", path}, {"xxh3", file_digest(path, "model.torchscript")}};
  }
  return source;
}

std::string compare_model_source(const nlohmann::json& saved, const nlohmann::json& current) {
  if (!saved.is_object() || saved.empty() || !current.is_object() || current.empty()) return "";
  const auto text = [](const json& j, const char* key) {
    return j.contains(key) ? (j[key].is_string() ? j[key].get<std::string>() : j[key].dump()) : "?";
  };
  std::string differences;
  for (const char* key : {"abi_version", "xxh3"}) {
    if (text(saved, key) != text(current, key))
      differences += std::string(differences.empty() ? "" : ", ") + key + " " + text(saved, key) +
                     " -> " + text(current, key);
  }
  if (differences.empty()) return "";
  return "the " + text(current, "kind") + " " + text(current, "path") +
         " is not the file the checkpoint was trained with (" + text(saved, "path") + ": " +
         differences + ")";
}

}  // namespace gpurun

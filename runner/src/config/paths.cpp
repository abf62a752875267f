#include "config/paths.h"

#include <filesystem>
#include <system_error>

#include <spdlog/spdlog.h>

#include "gpurun/errors.h"

namespace gpurun {

namespace stdfs = std::filesystem;

std::string resolve_input_path(const RunConfig& config, const std::string& key,
                               const std::string& path, bool log) {
  // An s3:// URL (data.path in a bucket, staged by data/data_stage.h) is not a path.
  if (path.empty() || stdfs::path(path).is_absolute() || path.rfind("s3://", 0) == 0) return path;
  const std::string beside = config_path(config, path);  // run.yaml's folder
  const bool data_key = key == "data.path" || key == "data.eval_path" || key == "data.mask_path" ||
                        key == "data.eval_mask_path";
  if (!data_key || config.base_dir.empty()) return beside;
  std::error_code ec;
  const stdfs::path cwd = stdfs::current_path(ec);
  if (ec) return beside;
  const std::string from_cwd = (cwd / path).lexically_normal().string();
  if (from_cwd == beside) return beside;
  const bool here = stdfs::exists(beside, ec);
  const bool there = stdfs::exists(from_cwd, ec);
  if (here && there && !stdfs::equivalent(beside, from_cwd, ec))
    throw ConfigError(key + " " + path + " is relative, and names two different files: " + beside +
                      " (beside " + config.source + ", where relative paths point) and " +
                      from_cwd +
                      " (from the working directory, where older gpurun looked); "
                      "give the path of the one you mean");
  if (!here && there) {
    if (log)
      spdlog::warn(
          "{} {} is relative: it points beside {} ({}), where there is nothing; reading {} from "
          "the working directory, as older gpurun did. Move it beside the config or give an "
          "absolute path: this fallback is for runs started before the rule",
          key, path, config.source, beside, from_cwd);
    return from_cwd;
  }
  return beside;
}

DataConfig resolved_data(const RunConfig& config, bool log) {
  DataConfig data = config.data;
  data.path = resolve_input_path(config, "data.path", data.path, log);
  data.eval_path = resolve_input_path(config, "data.eval_path", data.eval_path, log);
  data.mask_path = resolve_input_path(config, "data.mask_path", data.mask_path, log);
  data.eval_mask_path = resolve_input_path(config, "data.eval_mask_path", data.eval_mask_path, log);
  return data;
}

}  // namespace gpurun

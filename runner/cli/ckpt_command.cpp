#include "cli/ckpt_command.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <sstream>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/store.h"
#include "gpurun/errors.h"
#include "util/fs.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

int64_t epoch_of(const CheckpointInfo& info) {
  if (info.manifest.is_object() && info.manifest.contains("epoch") &&
      info.manifest["epoch"].is_number_integer()) {
    return info.manifest["epoch"].get<int64_t>();
  }
  long long epoch = -1, step = -1;
  return std::sscanf(info.name.c_str(), "ckpt-e%lld-s%lld", &epoch, &step) == 2 ? epoch : -1;
}

// The name in DIR/LATEST, or nullopt when there is no LATEST.
std::optional<std::string> read_latest(const std::string& dir) {
  try {
    std::string latest = fs::read_file((stdfs::path(dir) / "LATEST").string());
    latest.erase(latest.find_last_not_of(" \t\r\n") + 1);
    return latest;
  } catch (const IoError& e) {
    if (e.error_number() == ENOENT) return std::nullopt;
    throw;
  }
}

const CheckpointInfo* newest_complete(const std::vector<CheckpointInfo>& infos) {
  for (auto it = infos.rbegin(); it != infos.rend(); ++it) {
    if (it->complete) return &*it;
  }
  return nullptr;
}

json or_null(const CheckpointInfo* info) { return info ? json(info->name) : json(nullptr); }

int list(const std::string& dir, bool as_json, std::ostream& out) {
  const std::vector<CheckpointInfo> infos = CheckpointStore(dir, 1).list(/*verify=*/false);
  const std::optional<std::string> latest = read_latest(dir);
  if (as_json) {
    json rows = json::array();
    for (const auto& info : infos) {
      rows.push_back({{"name", info.name},
                      {"path", info.path},
                      {"epoch", epoch_of(info)},
                      {"global_step", info.global_step},
                      {"bytes", info.bytes},
                      {"complete", info.complete},
                      {"problem", info.problem},
                      {"latest", latest && *latest == info.name}});
    }
    out << json{{"dir", dir},
                {"checkpoints", rows},
                {"latest", latest ? json(*latest) : json(nullptr)},
                {"newest_complete", or_null(newest_complete(infos))}}
               .dump(2)
        << "\n";
    return kExitOk;
  }
  size_t width = 4;
  for (const auto& info : infos) width = std::max(width, info.name.size());
  out << std::left << std::setw(static_cast<int>(width)) << "NAME"
      << "  " << std::right << std::setw(5) << "EPOCH"
      << "  " << std::setw(9) << "STEP"
      << "  " << std::setw(12) << "BYTES"
      << "  STATUS\n";
  for (const auto& info : infos) {
    out << std::left << std::setw(static_cast<int>(width)) << info.name << "  " << std::right
        << std::setw(5) << epoch_of(info) << "  " << std::setw(9) << info.global_step << "  "
        << std::setw(12) << info.bytes << "  "
        << (info.complete ? "complete" : "INCOMPLETE: " + info.problem)
        << (latest && *latest == info.name ? "  <- LATEST" : "") << "\n";
  }
  if (infos.empty()) out << "(no checkpoints in " << dir << ")\n";
  if (latest && std::none_of(infos.begin(), infos.end(),
                             [&](const CheckpointInfo& i) { return i.name == *latest; })) {
    out << "LATEST names '" << *latest << "', which is not here\n";
  }
  return kExitOk;
}

int verify(const std::string& dir, bool as_json, std::ostream& out) {
  const std::vector<CheckpointInfo> infos = CheckpointStore(dir, 1).list(/*verify=*/true);
  const CheckpointInfo* newest = newest_complete(infos);
  const int code = newest ? kExitOk : kExitFailure;
  if (as_json) {
    json rows = json::array();
    for (const auto& info : infos) {
      rows.push_back({{"name", info.name}, {"complete", info.complete}, {"problem", info.problem}});
    }
    out << json{{"dir", dir},
                {"ok", newest != nullptr},
                {"checkpoints", rows},
                {"newest_complete", or_null(newest)}}
               .dump(2)
        << "\n";
    return code;
  }
  for (const auto& info : infos) {
    out << (info.complete ? "ok      " : "FAILED  ") << info.name
        << (info.complete ? "" : ": " + info.problem) << "\n";
  }
  if (newest) {
    out << "newest complete checkpoint: " << newest->name << "\n";
  } else {
    out << "no checkpoint in " << dir << " verifies\n";
  }
  return code;
}

void print_summary(const CheckpointInfo& info, std::ostream& out) {
  const json& m = info.manifest;
  const auto row = [&](const std::string& key, const std::string& value) {
    out << "  " << std::left << std::setw(18) << key << value << "\n";
  };
  const auto field = [&](const char* key) {
    if (!m.contains(key)) return std::string("-");
    return m[key].is_string() ? m[key].get<std::string>() : m[key].dump();
  };
  out << "checkpoint " << info.path << "\n";
  row("status", info.complete ? "complete (checksums verified)" : "DAMAGED: " + info.problem);
  for (const char* key : {"format_version", "gpurun_version", "torch_version", "created", "epoch",
                          "global_step", "position_in_epoch", "world_size", "model_digest",
                          "config_hash", "threads", "cpu_capability", "plan"}) {
    row(key, field(key));
  }
  out << "  files\n";
  if (m.contains("files") && m["files"].is_object()) {
    for (const auto& [name, entry] : m["files"].items()) {
      out << "    " << std::left << std::setw(16) << name << std::right << std::setw(14)
          << (entry.contains("bytes") ? entry["bytes"].dump() : "?") << " bytes  xxh3 "
          << (entry.contains("xxh3") && entry["xxh3"].is_string() ? entry["xxh3"].get<std::string>()
                                                                  : "?")
          << "\n";
    }
  }
}

int inspect(const std::string& dir, bool as_json, std::ostream& out) {
  // One ckpt-* folder, or a root whose newest complete checkpoint is meant.
  const std::string base = stdfs::path(dir).lexically_normal().filename().string();
  std::error_code ec;
  const bool is_folder =
      base.rfind("ckpt-", 0) == 0 || stdfs::exists(stdfs::path(dir) / "manifest.json", ec);
  CheckpointInfo info;
  if (is_folder) {
    info = CheckpointStore::inspect(dir, /*verify=*/true);
    if (!info.manifest.is_object()) {
      throw ResumeError("checkpoint " + dir + " has no readable manifest: " + info.problem);
    }
  } else {
    const std::vector<CheckpointInfo> infos = CheckpointStore(dir, 1).list(/*verify=*/true);
    const CheckpointInfo* newest = newest_complete(infos);
    if (!newest) {
      throw ResumeError("no complete checkpoint in " + dir + " (" + std::to_string(infos.size()) +
                        " ckpt-* folders; `gpurun ckpt verify` says what is wrong)");
    }
    info = *newest;
  }
  if (!info.complete) spdlog::warn("checkpoint {} does not verify: {}", info.path, info.problem);
  if (as_json) {
    out << info.manifest.dump(2) << "\n";
  } else {
    print_summary(info, out);
  }
  return info.complete ? kExitOk : kExitFailure;
}

}  // namespace

int ckpt_command(const std::string& action, const std::string& dir, bool as_json,
                 std::ostream& out) {
  if (action != "list" && action != "verify" && action != "inspect") {
    throw ConfigError("unknown ckpt command '" + action + "'; expected list, verify or inspect");
  }
  std::error_code ec;
  if (!stdfs::exists(dir, ec)) {
    throw ConfigError("gpurun ckpt " + action + ": no such directory: " + dir);
  }
  if (!stdfs::is_directory(dir, ec)) {
    throw ConfigError("gpurun ckpt " + action + ": not a directory: " + dir);
  }
  if (action == "list") return list(dir, as_json, out);
  if (action == "verify") return verify(dir, as_json, out);
  return inspect(dir, as_json, out);
}

}  // namespace gpurun

#include "cli/ckpt_command.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <optional>
#include <sstream>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/format/metric_rank.h"
#include "checkpoint/format/shard_index.h"
#include "checkpoint/storage/store.h"
#include "gpurun/errors.h"
#include "util/text.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

json or_null(const CheckpointInfo* info) { return info ? json(info->name) : json(nullptr); }

// Bytes from disk that are not UTF-8 (a garbage LATEST) become U+FFFD rather than an exception:
// the one JSON object is printed whatever the directory holds.
void print_json(const json& j, std::ostream& out) {
  out << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
}

}  // namespace

std::string local_tier_of(const CheckpointView& view, const std::vector<CheckpointInfo>& infos) {
  std::string tier;
  for (auto it = infos.rbegin(); it != infos.rend() && tier.empty(); ++it) {
    const json& m = it->manifest;
    if (m.is_object() && m.contains("extra") && m["extra"].is_object() &&
        m["extra"].contains("local_tier") && m["extra"]["local_tier"].is_string())
      tier = m["extra"]["local_tier"].get<std::string>();
  }
  if (tier.empty()) {
    std::ifstream in(view.dir() + "/status.json");
    const json status = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (status.is_object() && status.contains("local_tier") && status["local_tier"].is_string())
      tier = status["local_tier"].get<std::string>();
  }
  std::error_code ec;
  return !tier.empty() && stdfs::is_directory(tier, ec) ? tier : "";
}

namespace {

json set_aside_json(const CheckpointView& view) {
  json rows = json::array();
  for (const auto& info : view.set_aside())
    rows.push_back({{"name", info.name},
                    {"path", info.path},
                    {"epoch", info.epoch},
                    {"global_step", info.global_step}});
  return rows;
}

// "aside   NAME  (set aside as damaged by a resume: never loaded again)" for each.
void set_aside_text(const CheckpointView& view, std::ostream& out) {
  for (const auto& info : view.set_aside())
    out << "aside   " << printable(info.name)
        << "  (set aside as damaged by a resume: never loaded again)\n";
}

/// "best #1 eval_loss=1.0000" for a checkpoint among keep_best's k, else "".
std::string best_mark(const BestRanking& ranking, size_t i) {
  const int64_t rank = ranking.rank_of(i);
  if (!rank) return "";
  std::ostringstream mark;
  mark << "best #" << rank << " " << ranking.goal->metric << "=" << std::fixed
       << std::setprecision(4) << *ranking.values[i];
  return mark.str();
}

json list_json(const CheckpointView& view, const std::vector<CheckpointInfo>& infos) {
  const LatestFile latest = view.latest();
  const BestRanking ranking = rank_checkpoints(infos);
  json rows = json::array();
  for (size_t i = 0; i < infos.size(); ++i) {
    const CheckpointInfo& info = infos[i];
    const int64_t rank = ranking.rank_of(i);
    rows.push_back({{"name", info.name},
                    {"path", info.path},
                    {"epoch", info.epoch},
                    {"global_step", info.global_step},
                    {"bytes", info.bytes},
                    {"complete", info.complete},
                    {"problem", info.problem},
                    {"sealed", info.sealed},
                    {"latest", latest.names(info.name)},
                    // The metric recorded (null: none, a step checkpoint) and the rank among
                    // keep_best's k (null: not among them, or keep_best off).
                    {"metric", ranking.values[i] ? json(*ranking.values[i]) : json(nullptr)},
                    {"best", rank ? json(rank) : json(nullptr)}});
  }
  const bool has_latest = latest.state == LatestFile::State::kPresent;
  json keep_best = nullptr;
  if (ranking.goal)
    keep_best = {
        {"metric", ranking.goal->metric}, {"mode", ranking.goal->mode}, {"k", ranking.goal->k}};
  return {{"dir", view.dir()},
          {"keep_best", keep_best},
          {"checked", "sizes"},
          {"checkpoints", rows},
          {"set_aside", set_aside_json(view)},
          {"latest", has_latest ? json(latest.name) : json(nullptr)},
          {"newest_complete", or_null(CheckpointView::newest_complete(infos))}};
}

void list_text(const CheckpointView& view, const std::vector<CheckpointInfo>& infos,
               std::ostream& out) {
  const LatestFile latest = view.latest();
  const std::vector<CheckpointInfo> aside = view.set_aside();
  size_t width = 4;
  for (const auto* group : {&infos, &aside}) {
    for (const auto& info : *group) width = std::max(width, printable(info.name).size());
  }
  out << std::left << std::setw(static_cast<int>(width)) << "NAME"
      << "  " << std::right << std::setw(5) << "EPOCH"
      << "  " << std::setw(9) << "STEP"
      << "  " << std::setw(12) << "BYTES"
      << "  STATUS\n";
  const BestRanking ranking = rank_checkpoints(infos);
  const auto row = [&](const CheckpointInfo& info, const std::string& status,
                       const std::string& best = "") {
    out << std::left << std::setw(static_cast<int>(width)) << printable(info.name) << "  "
        << std::right << std::setw(5) << info.epoch << "  " << std::setw(9) << info.global_step
        << "  " << std::setw(12)
        << (starts_with(status, "SET ASIDE") ? "-" : std::to_string(info.bytes)) << "  " << status
        << (best.empty() ? "" : "  " + best) << (latest.names(info.name) ? "  <- LATEST" : "")
        << "\n";
  };
  for (size_t i = 0; i < infos.size(); ++i) {
    const CheckpointInfo& info = infos[i];
    row(info,
        info.complete ? std::string(info.sealed ? "sizes ok" : "sizes ok, manifest unsealed")
                      : "DAMAGED: " + printable(info.problem),
        best_mark(ranking, i));
  }
  for (const auto& info : aside) row(info, "SET ASIDE as damaged by a resume: never loaded again");
  if (infos.empty() && aside.empty()) {
    out << "(no checkpoints in " << view.dir() << ")\n";
  } else {  // a flipped byte keeps its size: only verify finds it
    out << "(sizes ok: each manifest's own checksum matches and every file it names is there at "
           "its size; the files' checksums were not read: `gpurun ckpt verify "
        << view.dir() << "` reads them)\n";
  }
  const bool latest_here = std::any_of(
      infos.begin(), infos.end(), [&](const CheckpointInfo& i) { return latest.names(i.name); });
  if (latest.state == LatestFile::State::kPresent && !latest_here) {
    out << latest.describe() << ", which is not here\n";
  } else if (latest.state != LatestFile::State::kPresent && !infos.empty()) {
    out << latest.describe() << "\n";
  }
}

// Whether every checkpoint of `infos` verifies and one does: `gpurun ckpt verify`'s exit 0.
bool all_verify(const std::vector<CheckpointInfo>& infos) {
  return !infos.empty() && std::all_of(infos.begin(), infos.end(),
                                       [](const CheckpointInfo& i) { return i.complete; });
}

json verify_json(const CheckpointView& view, const std::vector<CheckpointInfo>& infos) {
  const CheckpointInfo* newest = CheckpointView::newest_complete(infos);
  json rows = json::array();
  int64_t failed = 0;
  for (const auto& info : infos) {
    rows.push_back({{"name", info.name},
                    {"complete", info.complete},
                    {"problem", info.problem},
                    {"sealed", info.sealed}});
    failed += !info.complete;
  }
  return {{"dir", view.dir()},
          {"ok", all_verify(infos)},
          {"checked", "checksums"},
          {"failed", failed},
          {"checkpoints", rows},
          {"set_aside", set_aside_json(view)},
          {"newest_complete", or_null(newest)}};
}

void verify_text(const CheckpointView& view, const std::vector<CheckpointInfo>& infos,
                 std::ostream& out) {
  int64_t failed = 0;
  for (const auto& info : infos) {
    failed += !info.complete;
    out << (info.complete ? "ok      " : "FAILED  ") << printable(info.name)
        << (info.complete ? "" : ": " + printable(info.problem))
        << (info.complete && !info.sealed
                ? "  (manifest of format_version 1: no checksum of its own; its epoch and step "
                  "agree with the name)"
                : "")
        << "\n";
  }
  set_aside_text(view, out);
  if (const CheckpointInfo* newest = CheckpointView::newest_complete(infos)) {
    out << "newest complete checkpoint: " << printable(newest->name) << " (a resume takes it)\n";
  } else {
    out << "no checkpoint in " << view.dir() << " verifies\n";
  }
  if (failed > 0) out << failed << " checkpoint(s) FAILED verification\n";
}

using TierJson = json (*)(const CheckpointView&, const std::vector<CheckpointInfo>&);
using TierText = void (*)(const CheckpointView&, const std::vector<CheckpointInfo>&, std::ostream&);

// Prints DIR's checkpoints (checksums checked with `verify`), then those of its local tier when
// this machine holds one, each tier as it keeps them (`local_tier` in the JSON). Returns DIR's,
// and the local tier's in `local_out`.
std::vector<CheckpointInfo> print_tiers(const CheckpointView& view, bool verify, bool as_json,
                                        std::ostream& out, TierJson to_json, TierText to_text,
                                        std::vector<CheckpointInfo>* local_out = nullptr) {
  std::vector<CheckpointInfo> infos = view.list(verify);
  const std::string tier = local_tier_of(view, infos);
  std::optional<CheckpointView> local;
  std::vector<CheckpointInfo> local_infos;
  if (!tier.empty()) {
    local.emplace(tier);
    local_infos = local->list(verify);
    if (local_out) *local_out = local_infos;
  }
  if (as_json) {
    json j = to_json(view, infos);
    j["local_tier"] = local ? to_json(*local, local_infos) : json(nullptr);
    print_json(j, out);
    return infos;
  }
  if (local) out << "network tier " << view.dir() << ":\n";
  to_text(view, infos, out);
  if (local) {
    out << "\nlocal tier " << local->dir() << ":\n";
    to_text(*local, local_infos, out);
  }
  return infos;
}

int list(const CheckpointView& view, bool as_json, std::ostream& out) {
  print_tiers(view, /*verify=*/false, as_json, out, list_json, list_text);
  return kExitOk;
}

// 0 when a checkpoint of DIR verifies and every checkpoint of both tiers does (a resume may
// take either tier's), 1 otherwise.
int verify(const CheckpointView& view, bool as_json, std::ostream& out) {
  std::vector<CheckpointInfo> local;
  const std::vector<CheckpointInfo> infos =
      print_tiers(view, /*verify=*/true, as_json, out, verify_json, verify_text, &local);
  const bool local_ok =
      std::all_of(local.begin(), local.end(), [](const CheckpointInfo& i) { return i.complete; });
  return all_verify(infos) && local_ok ? kExitOk : kExitFailure;
}

void print_summary(const CheckpointInfo& info, std::ostream& out) {
  const json& m = info.manifest;
  const auto row = [&](const std::string& key, const std::string& value) {
    out << "  " << std::left << std::setw(18) << key << value << "\n";
  };
  const auto field = [&](const char* key) {
    if (!m.contains(key)) return std::string("-");
    return m[key].is_string() ? printable(m[key].get<std::string>()) : m[key].dump();
  };
  out << "checkpoint " << info.path << "\n";
  row("status",
      info.complete ? "complete (checksums verified)" : "DAMAGED: " + printable(info.problem));
  if (info.complete)
    row("manifest", info.sealed
                        ? "sealed (its own xxh3 matches; epoch and step agree with the name)"
                        : "format_version 1: no checksum of its own (epoch and step agree "
                          "with the name)");
  for (const char* key : {"format_version", "gpurun_version", "torch_version", "created", "epoch",
                          "global_step", "position_in_epoch", "world_size", "model_digest",
                          "config_hash", "threads", "cpu_capability", "plan"}) {
    row(key, field(key));
  }
  // A sharded checkpoint: who wrote its optimizer state and where (checkpoint/shard_index.h).
  if (m.contains(kShardedOptimizerKey)) {
    try {
      const ShardIndex index = ShardIndex::from_json(m[kShardedOptimizerKey]);
      std::string states;
      for (const std::string& s : index.states) states += (states.empty() ? "" : ", ") + s;
      row("optimizer", "sharded over " + std::to_string(index.world_size) + " ranks (" +
                           printable(index.optimizer) + ", step " +
                           std::to_string(index.step_count) + "): " + printable(states) + " of " +
                           std::to_string(index.parameters.size()) + " parameters in " +
                           std::to_string(index.files.size()) + " shard files");
    } catch (const std::invalid_argument& e) {
      row("optimizer", "sharded, but " + printable(e.what()));
    }
  } else {
    row("optimizer", "unsharded (optim.pt)");
  }
  // extra: the model's source, the running epoch sums, the precision, fp16's scaler, init_from,
  // deterministic, the local tier, ... (docs/architecture.md, "Manifest"), one dotted key a
  // line.
  out << "  extra\n";
  std::vector<std::pair<std::string, std::string>> extra;
  const std::function<void(const json&, const std::string&)> flatten = [&](const json& j,
                                                                           const std::string& key) {
    if (j.is_object() && !j.empty()) {
      for (const auto& [name, value] : j.items())
        flatten(value, key.empty() ? printable(name) : key + "." + printable(name));
    } else {
      extra.emplace_back(key, j.is_string() ? printable(j.get<std::string>()) : j.dump());
    }
  };
  if (m.contains("extra") && m["extra"].is_object() && !m["extra"].empty()) flatten(m["extra"], "");
  size_t width = 0;
  for (const auto& [key, value] : extra) width = std::max(width, key.size());
  for (const auto& [key, value] : extra)
    out << "    " << std::left << std::setw(static_cast<int>(width + 2)) << key << value << "\n";
  if (extra.empty()) out << "    -\n";
  out << "  files\n";
  if (m.contains("files") && m["files"].is_object()) {
    for (const auto& [name, entry] : m["files"].items()) {
      out << "    " << std::left << std::setw(16) << printable(name) << std::right << std::setw(14)
          << (entry.contains("bytes") ? entry["bytes"].dump() : "?") << " bytes  xxh3 "
          << (entry.contains("xxh3") && entry["xxh3"].is_string()
                  ? printable(entry["xxh3"].get<std::string>())
                  : "?")
          << "\n";
    }
  }
}

int inspect(const std::string& dir, bool as_json, std::ostream& out) {
  // One ckpt-* folder, or a root whose newest complete checkpoint is meant.
  CheckpointInfo info;
  if (CheckpointView::is_checkpoint_folder(dir)) {
    info = CheckpointView::inspect(dir, /*verify=*/true);
    if (!info.manifest.is_object()) {
      throw ResumeError("checkpoint " + dir + " has no readable manifest: " + info.problem);
    }
  } else {
    const CheckpointView view(dir);
    std::optional<CheckpointInfo> newest = view.newest_complete();
    if (!newest) {
      throw ResumeError("no complete checkpoint in " + dir + " (" +
                        std::to_string(view.list(/*verify=*/false).size()) +
                        " ckpt-* folders; `gpurun ckpt verify " + dir + "` says what is wrong)");
    }
    info = std::move(*newest);
  }
  if (!info.complete) spdlog::warn("checkpoint {} does not verify: {}", info.path, info.problem);
  if (as_json) {
    print_json(info.manifest, out);
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
  if (is_object_root(dir)) {
    // Settings, credentials, the endpoint and the bucket, at once: a ConfigError names the cause.
    open_storage(dir)->check_readable();
  } else if (!stdfs::exists(dir, ec)) {
    throw ConfigError("gpurun ckpt " + action + ": no such directory: " + dir);
  } else if (!stdfs::is_directory(dir, ec)) {
    throw ConfigError("gpurun ckpt " + action + ": not a directory: " + dir);
  }
  if (action == "list") return list(CheckpointView(dir), as_json, out);
  if (action == "verify") return verify(CheckpointView(dir), as_json, out);
  return inspect(dir, as_json, out);
}

}  // namespace gpurun

#include "checkpoint/format/manifest.h"

#include <cerrno>
#include <cstring>
#include <ctime>

#include <torch/version.h>  // TORCH_VERSION only; this file must not pull in torch/torch.h

#include "checkpoint/format/folder.h"
#include "checkpoint/format/shard_index.h"
#include "gpurun/errors.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/version.h"

namespace gpurun {
namespace {

using json = nlohmann::json;
using namespace checkpoint_folder;

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

template <typename T>
T get_field(const json& m, const char* key) {
  const auto it = m.find(key);
  if (it == m.end()) throw ResumeError(std::string("manifest.json: missing field ") + key);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw ResumeError(std::string("manifest.json: field ") + key + " has the wrong type (" +
                      it->type_name() + ")");
  }
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/// Where the seal of `text` begins (its comma) and the checksum it records, found from the end:
/// `, "manifest_xxh3" : "<16 hex>" }` and whitespace. Every quote of that pattern follows a
/// character other than a backslash, so none is escaped: the comma is the object's own, and the
/// member is the top-level object's last. npos when the text does not end so.
size_t find_seal(const std::string& text, std::string& recorded) {
  constexpr size_t npos = std::string::npos;
  size_t i = text.size();
  const auto skip_space = [&] {
    while (i > 0 && is_space(text[i - 1])) --i;
  };
  const auto expect = [&](const std::string& token) {
    if (i < token.size() || text.compare(i - token.size(), token.size(), token) != 0) return false;
    i -= token.size();
    return true;
  };
  skip_space();
  if (!expect("}")) return npos;
  skip_space();
  if (!expect("\"") || i < 16) return npos;
  recorded = text.substr(i - 16, 16);
  for (const char c : recorded)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return npos;
  i -= 16;
  if (!expect("\"")) return npos;
  skip_space();
  if (!expect(":")) return npos;
  skip_space();
  if (!expect(std::string("\"") + kManifestChecksum + "\"")) return npos;
  skip_space();
  if (!expect(",")) return npos;
  return i;
}

}  // namespace

namespace checkpoint_folder {

std::string manifest_text(const CheckpointMeta& meta, const json& files) {
  nlohmann::ordered_json m;
  const bool sharded = !meta.sharded_optimizer.is_null();
  m["format_version"] = sharded ? kShardedFormatVersion : kCheckpointFormatVersion;
  m["gpurun_version"] = gpurun_version();
  m["torch_version"] = TORCH_VERSION;
  m["created"] = utc_now_iso8601();
  m["epoch"] = meta.epoch;
  m["global_step"] = meta.global_step;
  m["position_in_epoch"] = meta.position_in_epoch;
  m["world_size"] = meta.world_size;
  m["config_hash"] = meta.config_hash;
  m["model_digest"] = meta.model_digest;
  m["threads"] = meta.threads;
  m["cpu_capability"] = meta.cpu_capability;
  m["config"] = meta.config;
  m["plan"] = meta.plan;
  m["extra"] = meta.extra;
  if (sharded) m[kShardedOptimizerKey] = meta.sharded_optimizer;
  m["files"] = files;
  // dump(2) of an object with members ends in "\n}": the seal goes before that brace.
  std::string text = m.dump(2);
  text.resize(text.size() - 2);
  return text + ",\n  \"" + kManifestChecksum + "\": \"" + xxh3_hex(text) + "\"\n}\n";
}

std::string check_seal(const std::string& text, bool& sealed) {
  std::string recorded;
  const size_t end = find_seal(text, recorded);
  sealed = end != std::string::npos;
  if (!sealed) return std::string("manifest.json: no ") + kManifestChecksum + " as its last member";
  Xxh3 hash;
  hash.update(text.data(), end);
  if (hash.hex() != recorded)
    return std::string("manifest.json: its own xxh3 ") + hash.hex() + " does not match its " +
           kManifestChecksum + " " + recorded + " (the manifest was changed)";
  return "";
}

std::string check_manifest(const std::string& text, CheckpointInfo& info) {
  json m = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded()) {
    return "manifest.json: not valid JSON (" + std::to_string(text.size()) + " bytes)";
  }
  if (!m.is_object()) return "manifest.json: not a JSON object";
  info.manifest = m;
  const auto version = m.find("format_version");
  if (version == m.end() || !version->is_number_integer()) {
    return "manifest.json: no integer format_version";
  }
  const int64_t format = version->get<int64_t>();
  if (format > kShardedFormatVersion) {
    return "manifest.json: format_version " + std::to_string(format) + " is newer than the " +
           std::to_string(kShardedFormatVersion) + " this gpurun reads";
  }
  if (format < kUnsealedFormatVersion)
    return "manifest.json: format_version " + std::to_string(format) + " does not exist";
  // A seal is checked whatever the version says; only format 1 may lack it.
  bool sealed = false;
  if (std::string problem = check_seal(text, sealed);
      !problem.empty() &&
      (sealed || format > kUnsealedFormatVersion || m.contains(kManifestChecksum)))
    return problem;
  info.sealed = sealed;
  CheckpointMeta meta;
  try {
    meta = meta_from_manifest(m);
  } catch (const ResumeError& e) {
    return e.what();
  }
  const auto files = m.find("files");
  if (files == m.end() || !files->is_object()) return "manifest.json: no files table";
  // A sharded checkpoint's chunks must lie in files its table lists.
  if (std::string problem = check_sharded_manifest(m); !problem.empty()) return problem;
  // The name is what a resume chooses by and what people read: it must say what the manifest
  // says. A folder given by a path of another form (a copy somewhere) is judged by its seal.
  if (const auto named = parse_checkpoint_name(info.name)) {
    if (named->epoch != meta.epoch || named->global_step != meta.global_step)
      return "manifest.json: epoch " + std::to_string(meta.epoch) + ", global step " +
             std::to_string(meta.global_step) + " disagree with the folder's name " + info.name;
  }
  info.epoch = meta.epoch;
  info.global_step = meta.global_step;
  return "";
}

}  // namespace checkpoint_folder

CheckpointMeta meta_from_manifest(const nlohmann::json& manifest) {
  if (!manifest.is_object()) throw ResumeError("manifest.json: not a JSON object");
  CheckpointMeta meta;
  meta.epoch = get_field<int64_t>(manifest, "epoch");
  meta.global_step = get_field<int64_t>(manifest, "global_step");
  meta.position_in_epoch = get_field<int64_t>(manifest, "position_in_epoch");
  meta.world_size = get_field<int64_t>(manifest, "world_size");
  meta.config_hash = get_field<std::string>(manifest, "config_hash");
  meta.config = get_field<json>(manifest, "config");
  meta.model_digest = get_field<std::string>(manifest, "model_digest");
  // Kept optional, so a manifest edited by hand or written by an older 1.x still loads.
  if (manifest.contains("plan")) meta.plan = get_field<json>(manifest, "plan");
  if (manifest.contains("threads")) meta.threads = get_field<int64_t>(manifest, "threads");
  if (manifest.contains("cpu_capability")) {
    meta.cpu_capability = get_field<std::string>(manifest, "cpu_capability");
  }
  if (manifest.contains("extra")) meta.extra = get_field<json>(manifest, "extra");
  if (manifest.contains(kShardedOptimizerKey))
    meta.sharded_optimizer = get_field<json>(manifest, kShardedOptimizerKey);
  return meta;
}

}  // namespace gpurun

#include "checkpoint/folder.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <future>
#include <optional>
#include <tuple>
#include <utility>

#include <spdlog/spdlog.h>

#include "checkpoint/store.h"
#include "gpurun/errors.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/text.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;
using namespace checkpoint_folder;

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

// "model.pt: cannot be read (read DIR/model.pt: Input/output error (errno 5))", or the
// IoError rethrown, as `read_errors` says.
std::string unreadable(const std::string& name, const IoError& e, ReadErrors read_errors) {
  if (read_errors == ReadErrors::kThrow) throw e;
  return name + ": cannot be read (" + e.what() + ")";
}

// Checks the file `name` of the checkpoint folder `path` against its manifest `entry`: its
// size, and with kChecksums its xxh3 (the file is read once, in chunks, never all of it in
// memory). Adds its size to `bytes`. Returns the problem, "" when it matches.
std::string check_file(const std::string& path, const std::string& name, const json& entry,
                       Check check, ReadErrors read_errors, int64_t& bytes) {
  FileEntry want;
  if (std::string problem = parse_entry(name, entry, want); !problem.empty()) return problem;
  const std::string file_path = join(path, name);
  int64_t size = 0;
  std::string got;
  try {
    // Before any read: a directory or a FIFO where a file belongs is damage (and a FIFO would
    // block the read).
    const fs::FileStatus status = fs::status(file_path);
    if (status.size >= 0 && !status.regular) return name + ": not a regular file";
    if (check == Check::kSizes)
      size = status.size;
    else
      std::tie(size, got) = xxh3_file(file_path);
  } catch (const IoError& e) {
    if (e.error_number() != ENOENT) return unreadable(name, e, read_errors);
    size = -1;
  }
  if (size < 0) return name + ": missing";
  bytes += size;
  if (size != want.bytes) {
    return name + ": size " + std::to_string(size) + " != " + std::to_string(want.bytes) +
           " in manifest";
  }
  if (check == Check::kChecksums && got != want.xxh3)
    return name + ": xxh3 mismatch (file " + got + ", manifest " + want.xxh3 + ")";
  return "";
}

}  // namespace

namespace checkpoint_folder {

std::string join(const std::string& dir, const std::string& name) {
  return (stdfs::path(dir) / name).string();
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool is_plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::vector<std::string> checkpoint_folders(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& name : fs::list_dir(dir)) {
    std::error_code ec;
    if (is_checkpoint_folder_name(name) && stdfs::is_directory(join(dir, name), ec)) {
      names.push_back(name);
    }
  }
  return names;
}

std::string read_manifest(const std::string& path, ReadErrors read_errors, CheckpointInfo& info,
                          std::string* text_out) {
  const std::string manifest_path = join(path, kManifest);
  std::string text;
  try {
    const fs::FileStatus status = fs::status(manifest_path);
    if (status.size < 0) return "manifest.json missing";
    if (!status.regular) return "manifest.json: not a regular file";
    text = fs::read_file(manifest_path);
  } catch (const IoError& e) {
    if (e.error_number() == ENOENT) return "manifest.json missing";
    return unreadable(kManifest, e, read_errors);
  }
  json m = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded()) {
    return "manifest.json: not valid JSON (" + std::to_string(text.size()) + " bytes)";
  }
  if (!m.is_object()) return "manifest.json: not a JSON object";
  info.manifest = m;
  const auto epoch = m.find("epoch");
  if (epoch != m.end() && epoch->is_number_integer()) info.epoch = epoch->get<int64_t>();
  const auto version = m.find("format_version");
  if (version == m.end() || !version->is_number_integer()) {
    return "manifest.json: no integer format_version";
  }
  if (version->get<int64_t>() > kCheckpointFormatVersion) {
    return "manifest.json: format_version " + std::to_string(version->get<int64_t>()) +
           " is newer than the " + std::to_string(kCheckpointFormatVersion) + " this gpurun reads";
  }
  try {
    info.global_step = meta_from_manifest(m).global_step;
  } catch (const ResumeError& e) {
    return e.what();
  }
  const auto files = m.find("files");
  if (files == m.end() || !files->is_object()) return "manifest.json: no files table";
  if (text_out) *text_out = std::move(text);
  return "";
}

std::string parse_entry(const std::string& name, const json& entry, FileEntry& out) {
  if (!is_plain_name(name) || name == kManifest)
    return "manifest.json: bad file name '" + name + "'";
  const auto bytes = entry.find("bytes");
  const auto xxh3 = entry.find("xxh3");
  if (!entry.is_object() || bytes == entry.end() || !bytes->is_number_integer() ||
      xxh3 == entry.end() || !xxh3->is_string()) {
    return "manifest.json: bad entry for " + name;
  }
  out = {bytes->get<int64_t>(), xxh3->get<std::string>()};
  return "";
}

CheckpointInfo examine(const std::string& path, Check check, ReadErrors read_errors) {
  CheckpointInfo info;
  stdfs::path p = stdfs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  info.path = path;
  info.name = p.filename().string();
  if (const auto parsed = parse_checkpoint_name(info.name)) {
    info.epoch = parsed->epoch;
    info.global_step = parsed->global_step;
  }
  info.problem = read_manifest(path, read_errors, info);
  if (!info.problem.empty()) return info;

  // Checksums of the files at once, each on its own thread: a resume verifies its checkpoint
  // in about the time of its largest file (hashing runs at memory speed, so cores help).
  using Checked = std::pair<std::string, int64_t>;  // the problem, the file's bytes
  std::vector<std::future<Checked>> checked;
  for (const auto& [name, entry] : info.manifest.at("files").items()) {
    const auto launch = check == Check::kChecksums ? std::launch::async : std::launch::deferred;
    checked.push_back(std::async(launch, [&, name = name, &entry = entry] {
      int64_t bytes = 0;
      std::string problem = check_file(path, name, entry, check, read_errors, bytes);
      return Checked{std::move(problem), bytes};
    }));
  }
  for (auto& c : checked) {
    const auto [problem, bytes] = c.get();
    info.bytes += bytes;
    if (!problem.empty()) info.problem += (info.problem.empty() ? "" : "; ") + problem;
  }
  info.complete = info.problem.empty();
  return info;
}

}  // namespace checkpoint_folder

using namespace checkpoint_folder;

std::string checkpoint_name(int64_t epoch, int64_t global_step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "ckpt-e%04lld-s%07lld", static_cast<long long>(epoch),
                static_cast<long long>(global_step));
  return buf;
}

std::optional<CheckpointName> parse_checkpoint_name(const std::string& name) {
  long long epoch = 0, step = 0;
  if (std::sscanf(name.c_str(), "ckpt-e%lld-s%lld", &epoch, &step) != 2) return std::nullopt;
  return CheckpointName{epoch, step};
}

bool is_checkpoint_folder_name(const std::string& name) {
  return starts_with(name, "ckpt-") && name.find(".damaged") == std::string::npos;
}

bool LatestFile::names(const std::string& checkpoint) const {
  return state == State::kPresent && name == checkpoint;
}

std::string LatestFile::describe() const {
  switch (state) {
    case State::kMissing:
      return "LATEST is missing";
    case State::kUnreadable:
      return "LATEST cannot be read (" + error + ")";
    case State::kPresent:
      break;
  }
  if (name.empty()) return "LATEST is empty";
  return "LATEST names " + printable_quoted(name);
}

const std::string& LoadedCheckpoint::file(const std::string& name) const {
  for (const auto& [file_name, bytes] : files) {
    if (file_name == name) return bytes;
  }
  throw ResumeError("checkpoint " + info.name + " has no file " + name);
}

std::pair<int64_t, std::string> LoadedCheckpoint::expected(const std::string& name) const {
  const json* table = info.manifest.is_object() && info.manifest.contains("files")
                          ? &info.manifest.at("files")
                          : nullptr;
  if (!table || !table->is_object() || !table->contains(name))
    throw ResumeError("checkpoint " + info.path + " has no file " + name);
  FileEntry entry;
  if (std::string problem = parse_entry(name, table->at(name), entry); !problem.empty())
    throw ResumeError("checkpoint " + info.path + ": " + problem);
  return {entry.bytes, entry.xxh3};
}

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
  return meta;
}

CheckpointView::CheckpointView(std::string dir, ReadErrors read_errors)
    : dir_(std::move(dir)), read_errors_(read_errors) {}

std::vector<CheckpointInfo> CheckpointView::list(bool verify) const {
  std::vector<CheckpointInfo> out;
  for (const auto& name : checkpoint_folders(dir_)) {
    out.push_back(
        examine(join(dir_, name), verify ? Check::kChecksums : Check::kSizes, read_errors_));
  }
  std::stable_sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.global_step != b.global_step ? a.global_step < b.global_step : a.name < b.name;
  });
  return out;
}

bool CheckpointView::has_checkpoints() const { return !checkpoint_folders(dir_).empty(); }

std::optional<CheckpointInfo> CheckpointView::newest_complete() const {
  const std::vector<CheckpointInfo> all = list(/*verify=*/false);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    CheckpointInfo info = it->complete ? examine(it->path, Check::kChecksums, read_errors_) : *it;
    if (info.complete) return info;
    spdlog::warn("skipping {}, which does not verify ({}); trying the previous checkpoint",
                 printable(info.name), info.problem);
  }
  return std::nullopt;
}

const CheckpointInfo* CheckpointView::newest_complete(const std::vector<CheckpointInfo>& infos) {
  for (auto it = infos.rbegin(); it != infos.rend(); ++it) {
    if (it->complete) return &*it;
  }
  return nullptr;
}

LatestFile CheckpointView::latest() const {
  LatestFile latest;
  try {
    latest.name = fs::read_file(join(dir_, kLatest));
    latest.name.erase(latest.name.find_last_not_of(" \t\r\n") + 1);
    latest.state = LatestFile::State::kPresent;
  } catch (const IoError& e) {
    if (e.error_number() != ENOENT) {
      latest.state = LatestFile::State::kUnreadable;
      latest.error = e.what();
    }
  }
  return latest;
}

bool CheckpointView::is_checkpoint_folder(const std::string& path) {
  stdfs::path p = stdfs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::error_code ec;
  // By the name's pattern, not its prefix: a local tier is named after --ckpt, and a --ckpt
  // named "ckpt" gives it a name like ckpt-aeb66c32, which is a root.
  return parse_checkpoint_name(p.filename().string()).has_value() ||
         stdfs::exists(p / kManifest, ec);
}

CheckpointInfo CheckpointView::inspect(const std::string& folder, bool verify,
                                       ReadErrors read_errors) {
  return examine(folder, verify ? Check::kChecksums : Check::kSizes, read_errors);
}

}  // namespace gpurun

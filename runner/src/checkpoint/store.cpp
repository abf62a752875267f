#include "checkpoint/store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <future>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>
#include <tuple>

#include <spdlog/spdlog.h>
#include <torch/version.h>  // TORCH_VERSION only; this file must not pull in torch/torch.h

#include "gpurun/errors.h"
#include "util/faults.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/text.h"
#include "util/version.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;
using Files = std::vector<std::pair<std::string, std::string>>;

constexpr const char* kManifest = "manifest.json";
constexpr const char* kLatest = "LATEST";

std::string join(const std::string& dir, const std::string& name) {
  return (stdfs::path(dir) / name).string();
}

std::string pid_string() { return std::to_string(::getpid()); }

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// A file name inside a checkpoint folder: one plain path component.
bool is_plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
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

enum class Check { kSizes, kChecksums };

// "model.pt: cannot be read (read DIR/model.pt: Input/output error (errno 5))", or the
// IoError rethrown, as `read_errors` says.
std::string unreadable(const std::string& name, const IoError& e, ReadErrors read_errors) {
  if (read_errors == ReadErrors::kThrow) throw e;
  return name + ": cannot be read (" + e.what() + ")";
}

// Reads and checks PATH/manifest.json into `info` (manifest, epoch, global step), and its bytes
// into `text` when given. Returns the problem that makes the checkpoint incomplete, "" when the
// manifest is usable.
std::string read_manifest(const std::string& path, ReadErrors read_errors, CheckpointInfo& info,
                          std::string* text_out = nullptr) {
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

// A file's entry in a manifest's files table.
struct FileEntry {
  int64_t bytes = 0;
  std::string xxh3;
};

// Reads the manifest entry of file `name` into `out`; returns the problem with it, "" when it
// is usable: a name that is not one plain path component (or is the manifest's own), or an
// entry without an integer `bytes` and a string `xxh3`.
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

// Reads DIR/NAME/manifest.json and checks every file it lists (check_file). What is wrong goes
// to `problem`. A missing file, or one that is not a regular file, is a problem; other I/O
// errors (EIO after retries, EACCES) are a problem or thrown, as `read_errors` says.
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
  struct Checked {
    std::future<std::string> problem;
    int64_t bytes = 0;
  };
  const json& files = info.manifest.at("files");
  std::vector<Checked> checked;
  checked.reserve(files.size());  // the threads write into the elements: no reallocation
  for (const auto& [name, entry] : files.items()) {
    Checked& c = checked.emplace_back();
    const auto launch = check == Check::kChecksums ? std::launch::async : std::launch::deferred;
    c.problem = std::async(launch, [&, name = name, &entry = entry, &bytes = c.bytes] {
      return check_file(path, name, entry, check, read_errors, bytes);
    });
  }
  for (Checked& c : checked) {
    const std::string problem = c.problem.get();
    info.bytes += c.bytes;
    if (!problem.empty()) info.problem += (info.problem.empty() ? "" : "; ") + problem;
  }
  info.complete = info.problem.empty();
  return info;
}

// The files table of a new checkpoint's manifest: {name: {bytes, xxh3}}. Throws
// std::invalid_argument for a file name that is not one plain path component, the manifest's
// own name, or a duplicate.
json hash_files(const Files& snapshot_files) {
  std::set<std::string> seen;
  json files = json::object();
  for (const auto& [name, bytes] : snapshot_files) {
    if (!is_plain_name(name) || name == kManifest || !seen.insert(name).second) {
      throw std::invalid_argument("bad or duplicate checkpoint file name '" + name + "'");
    }
    files[name] = {{"bytes", static_cast<int64_t>(bytes.size())}, {"xxh3", xxh3_hex(bytes)}};
  }
  return files;
}

// The manifest of a new checkpoint; format_version first, as the first thing a reader checks.
nlohmann::ordered_json make_manifest(const CheckpointMeta& meta, const json& files) {
  nlohmann::ordered_json m;
  m["format_version"] = kCheckpointFormatVersion;
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
  m["files"] = files;
  return m;
}

// Renames DIR/NAME out of the way (to a .tmp-del-* name that readers ignore and
// clean_temporaries() removes) and then deletes it, so that a crash mid-delete never leaves a
// half-deleted folder that looks like a checkpoint.
void delete_folder(const std::string& dir, const std::string& name) {
  const std::string doomed = join(dir, ".tmp-del-" + name + "-" + pid_string());
  fs::remove_all(doomed);
  fs::rename_durable(join(dir, name), doomed);
  fs::remove_all(doomed);
}

// Renames a damaged checkpoint to NAME.damaged (or NAME.damaged.N when taken); returns the
// new name.
std::string set_aside(const std::string& dir, const std::string& name) {
  std::string aside = name + ".damaged";
  for (int n = 1; fs::exists(join(dir, aside)); ++n) {
    aside = name + ".damaged." + std::to_string(n);
  }
  fs::rename_durable(join(dir, name), join(dir, aside));
  return aside;
}

}  // namespace

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
  return starts_with(p.filename().string(), "ckpt-") || stdfs::exists(p / kManifest, ec);
}

CheckpointInfo CheckpointView::inspect(const std::string& folder, bool verify,
                                       ReadErrors read_errors) {
  return examine(folder, verify ? Check::kChecksums : Check::kSizes, read_errors);
}

CheckpointStore::CheckpointStore(std::string dir, int64_t keep_last)
    : dir_(std::move(dir)), keep_last_(keep_last), view_(dir_, ReadErrors::kThrow) {
  if (keep_last_ < 1) {
    throw std::invalid_argument("checkpoint keep_last must be >= 1, got " +
                                std::to_string(keep_last_));
  }
}

SaveResult CheckpointStore::save(const CheckpointSnapshot& snapshot) {
  const json files = hash_files(snapshot.files);
  const std::string name = checkpoint_name(snapshot.meta.epoch, snapshot.meta.global_step);
  return commit(
      name, files, {"before_rename", "before_latest", ++saves_}, [&](const std::string& tmp) {
        int64_t bytes = 0;
        for (const auto& [file_name, data] : snapshot.files) {
          fs::write_file(join(tmp, file_name), data);
          bytes += static_cast<int64_t>(data.size());
        }
        fs::write_file(join(tmp, kManifest), make_manifest(snapshot.meta, files).dump(2) + "\n");
        return bytes;
      });
}

SaveResult CheckpointStore::copy_from(const std::string& folder) {
  CheckpointInfo source;
  source.path = folder;
  source.name = stdfs::path(folder).lexically_normal().filename().string();
  // The manifest travels unchanged: both tiers then describe the same checkpoint, byte for byte.
  std::string manifest_text;
  const std::string problem = read_manifest(folder, ReadErrors::kThrow, source, &manifest_text);
  if (!problem.empty() || !is_checkpoint_folder_name(source.name)) {
    throw ResumeError("checkpoint " + folder + " cannot be copied: " +
                      (problem.empty() ? "not a checkpoint folder name" : problem));
  }
  const json& files = source.manifest.at("files");
  return commit(source.name, files, {"copy_before_rename", "copy_before_latest", ++copies_},
                [&](const std::string& tmp) {
                  int64_t bytes = 0;
                  for (const auto& [file_name, entry] : files.items()) {
                    FileEntry want;
                    if (std::string bad = parse_entry(file_name, entry, want); !bad.empty())
                      throw ResumeError("checkpoint " + folder + " cannot be copied: " + bad);
                    // Checked as the bytes pass, so the copy reads the source once and never
                    // spreads a file damaged since it was written.
                    std::optional<Xxh3> hash;
                    const int64_t n = fs::with_retries([&] {
                      hash.emplace();
                      return fs::copy_file(
                          join(folder, file_name), join(tmp, file_name),
                          [&](const char* data, size_t size) { hash->update(data, size); });
                    });
                    if (n != want.bytes || hash->hex() != want.xxh3) {
                      throw ResumeError("checkpoint " + folder + " cannot be copied: " + file_name +
                                        " does not match its manifest (" + std::to_string(n) +
                                        " bytes, xxh3 " + hash->hex() + ")");
                    }
                    bytes += n;
                  }
                  fs::write_file(join(tmp, kManifest), manifest_text);
                  return bytes;
                });
}

SaveResult CheckpointStore::commit(const std::string& name, const json& files,
                                   const FaultPoints& faults,
                                   const std::function<int64_t(const std::string&)>& fill) {
  const auto start = std::chrono::steady_clock::now();
  SaveResult result;
  result.path = join(dir_, name);
  fs::make_dirs(dir_);
  result.bytes = write_folder(name, files, faults, fill);

  // Should this throw, the new checkpoint is complete but LATEST still names the previous one;
  // load_latest() goes by verified manifests, not by LATEST, so both states resume correctly.
  fault_point(faults.before_latest, faults.attempt);
  fs::replace_file(join(dir_, kLatest), name + "\n");
  result.write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.removed = apply_retention(name);
  return result;
}

int64_t CheckpointStore::write_folder(const std::string& name, const json& files,
                                      const FaultPoints& faults,
                                      const std::function<int64_t(const std::string&)>& fill) {
  const std::string final_path = join(dir_, name);
  // The same name exists when a resumed run saves the step it resumed from. A complete
  // checkpoint is never overwritten: that step's state is already safe on disk, and replacing
  // it could not be atomic on NFS. A folder that does not verify is not a checkpoint; it is
  // replaced.
  if (fs::exists(final_path)) {
    const CheckpointInfo existing = examine(final_path, Check::kChecksums, ReadErrors::kThrow);
    if (existing.complete) {
      if (existing.manifest.at("files") == files) {
        spdlog::info("checkpoint {} already exists with the same files; keeping it", final_path);
      } else {
        spdlog::warn(
            "checkpoint {} already exists and verifies but holds other bytes; keeping "
            "the existing one (a complete checkpoint is never overwritten)",
            final_path);
      }
      return existing.bytes;
    }
  }

  const std::string tmp = join(dir_, ".tmp-" + name + "-" + pid_string());
  try {
    fs::remove_all(tmp);  // left by an earlier process that had the same pid
    fs::make_dirs(tmp);
    const int64_t bytes = fill(tmp);
    fs::sync_dir(tmp);
    fault_point(faults.before_rename, faults.attempt);
    if (fs::exists(final_path)) {
      spdlog::warn("replacing {}, which does not verify", final_path);
      delete_folder(dir_, name);
    }
    {
      const std::lock_guard<std::timed_mutex> commit(commit_mutex_);
      fs::rename_durable(tmp, final_path);
    }
    return bytes;
  } catch (...) {
    try {
      fs::remove_all(tmp);
    } catch (const std::exception& e) {
      spdlog::warn("could not remove the temporary folder of a failed save: {}", e.what());
    }
    throw;
  }
}

std::vector<std::string> CheckpointStore::apply_retention(const std::string& just_written) {
  // Its failures are logged, not thrown: the new checkpoint is complete.
  std::vector<std::string> removed;
  try {
    const std::vector<CheckpointInfo> all = view_.list(/*verify=*/false);
    std::vector<const CheckpointInfo*> complete;
    for (const auto& info : all) {
      if (info.complete) complete.push_back(&info);
    }
    const int64_t newest_step = complete.empty() ? -1 : complete.back()->global_step;
    const size_t keep_from =
        complete.size() > static_cast<size_t>(keep_last_) ? complete.size() - keep_last_ : 0;
    std::vector<const CheckpointInfo*> doomed(complete.begin(), complete.begin() + keep_from);
    for (const auto& info : all) {
      if (!info.complete && info.global_step < newest_step) doomed.push_back(&info);
    }
    for (const CheckpointInfo* info : doomed) {
      if (info->name == just_written) continue;
      if (retention_guard_ && retention_guard_(info->name)) continue;  // being copied
      try {
        delete_folder(dir_, info->name);
        removed.push_back(info->name);
        spdlog::info("retention: removed {}{}", info->path,
                     info->complete ? "" : " (incomplete: " + info->problem + ")");
      } catch (const std::exception& e) {
        spdlog::warn("retention: could not remove {}: {}", info->name, e.what());
      }
    }
  } catch (const std::exception& e) {
    spdlog::warn("retention skipped: {}", e.what());
  }
  return removed;
}

std::optional<LoadedCheckpoint> CheckpointStore::load_latest() {
  const std::vector<CheckpointInfo> all = view_.list(/*verify=*/false);
  if (all.empty()) {
    // Only checkpoints set aside as damaged (by an earlier resume): starting fresh would
    // silently throw that run away, the more so in a restart loop. A person decides.
    std::vector<std::string> aside;
    for (const auto& name : fs::list_dir(dir_)) {
      if (starts_with(name, "ckpt-") && !is_checkpoint_folder_name(name)) aside.push_back(name);
    }
    if (aside.empty()) return std::nullopt;
    std::string message = "no complete checkpoint in " + dir_ +
                          ", only checkpoints set aside as "
                          "damaged by an earlier resume:";
    for (const auto& name : aside) message += "\n  " + printable(name);
    throw ResumeError(message +
                      "\nrefusing to start over and lose that run; check the storage "
                      "(`gpurun ckpt list " +
                      dir_ +
                      "`), then move them away or use "
                      "a new --ckpt directory to start fresh");
  }

  // Newest first. Every candidate newer than the one finally loaded failed verification and
  // is set aside; older ones are left to retention.
  std::vector<std::string> damaged;
  std::optional<LoadedCheckpoint> loaded;
  for (auto it = all.rbegin(); it != all.rend() && !loaded; ++it) {
    std::string problem = it->problem;
    if (problem.empty()) {
      CheckpointInfo info = examine(it->path, Check::kChecksums, ReadErrors::kThrow);
      if (info.complete) {
        CheckpointMeta meta = meta_from_manifest(info.manifest);
        loaded = LoadedCheckpoint{std::move(info), std::move(meta), {}};
        break;
      }
      problem = info.problem;
    }
    std::string where;
    try {
      where = "renamed to " + set_aside(dir_, it->name);
    } catch (const IoError& e) {
      where = std::string("could not rename it aside: ") + e.what();
    }
    spdlog::warn("checkpoint {} is damaged ({}); {}; trying the previous one", it->path, problem,
                 where);
    damaged.push_back(it->name + " (" + problem + "; " + where + ")");
  }
  if (!loaded) {
    std::string message = "no complete checkpoint in " + dir_ + ": every one failed verification:";
    for (const auto& d : damaged) message += "\n  " + d;
    throw ResumeError(message);
  }

  // LATEST is a hint for people and scripts; the newest verifying checkpoint decides.
  const LatestFile latest = view_.latest();
  if (!latest.names(loaded->info.name)) {
    spdlog::warn("{}, but the newest complete checkpoint is {}; using it and correcting LATEST",
                 latest.describe(), loaded->info.name);
    try {
      fs::replace_file(join(dir_, kLatest), loaded->info.name + "\n");
    } catch (const IoError& e) {
      spdlog::warn("could not correct LATEST: {}", e.what());
    }
  }
  return loaded;
}

LoadedCheckpoint CheckpointStore::load(const std::string& path) {
  CheckpointInfo info = examine(path, Check::kChecksums, ReadErrors::kThrow);
  if (!info.complete) throw ResumeError("checkpoint " + path + " does not verify: " + info.problem);
  CheckpointMeta meta = meta_from_manifest(info.manifest);
  return LoadedCheckpoint{std::move(info), std::move(meta), {}};
}

std::unique_lock<std::timed_mutex> CheckpointStore::hold_commits(double seconds) {
  std::unique_lock<std::timed_mutex> lock(commit_mutex_, std::defer_lock);
  (void)lock.try_lock_for(std::chrono::duration<double>(seconds));
  return lock;
}

void CheckpointStore::clean_temporaries() {
  // .tmp-* are checkpoint folders being written or deleted; .LATEST.tmp-* are replace_file()'s
  // temporaries of LATEST. Only the store writes either, so none can belong to a live writer
  // as long as this is not called while a save runs.
  const auto is_temporary = [](const std::string& name) {
    return starts_with(name, ".tmp-") || starts_with(name, ".LATEST.tmp-");
  };
  for (const auto& name : fs::list_dir(dir_)) {
    if (!is_temporary(name)) continue;
    const std::string path = join(dir_, name);
    spdlog::info("removing leftover temporary {}", path);
    try {
      fs::remove_all(path);
    } catch (const IoError& e) {
      spdlog::warn("could not remove {}: {}", path, e.what());
    }
  }
}

}  // namespace gpurun

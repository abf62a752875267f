#include "checkpoint/folder.h"
#include "checkpoint/manifest.h"

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

std::string name_of(const std::string& path) {
  return stdfs::path(path).lexically_normal().filename().string();
}

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

CheckpointView::CheckpointView(std::string dir, ReadErrors read_errors)
    : dir_(std::move(dir)), read_errors_(read_errors) {}

std::vector<CheckpointInfo> CheckpointView::list(bool verify) const {
  std::vector<CheckpointInfo> out;
  for (const auto& name : checkpoint_folders(dir_)) {
    CheckpointInfo info =
        examine(join(dir_, name), verify ? Check::kChecksums : Check::kSizes, read_errors_);
    // Deleted by a live run's retention meanwhile (renamed to .tmp-del-*): no longer there.
    std::error_code ec;
    if (!info.complete && !stdfs::exists(info.path, ec)) continue;
    out.push_back(std::move(info));
  }
  std::stable_sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.global_step != b.global_step ? a.global_step < b.global_step : a.name < b.name;
  });
  return out;
}

std::vector<CheckpointInfo> CheckpointView::set_aside() const {
  std::vector<CheckpointInfo> out;
  for (const auto& name : fs::list_dir(dir_)) {
    if (!starts_with(name, "ckpt-") || is_checkpoint_folder_name(name)) continue;
    CheckpointInfo info;
    info.name = name;
    info.path = join(dir_, name);
    info.problem = "set aside as damaged";
    if (const auto parsed = parse_checkpoint_name(name)) {
      info.epoch = parsed->epoch;
      info.global_step = parsed->global_step;
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.global_step != b.global_step ? a.global_step < b.global_step : a.name < b.name;
  });
  return out;
}

CheckpointSummary CheckpointView::summary(bool verify) const {
  CheckpointSummary s;
  s.checksums = verify;
  const std::vector<CheckpointInfo> all = list(/*verify=*/false);
  for (auto it = all.rbegin(); it != all.rend() && !s.newest_complete; ++it) {
    CheckpointInfo info =
        verify && it->complete ? examine(it->path, Check::kChecksums, read_errors_) : *it;
    if (info.complete)
      s.newest_complete = std::move(info);
    else
      s.newer_damaged.push_back(std::move(info));
  }
  s.set_aside = set_aside();
  return s;
}

const CheckpointInfo* CheckpointSummary::newest() const {
  if (!newer_damaged.empty()) return &newer_damaged.front();
  return newest_complete ? &*newest_complete : nullptr;
}

const CheckpointInfo* CheckpointSummary::lost() const {
  const int64_t complete = newest_complete ? newest_complete->global_step : -1;
  return !set_aside.empty() && set_aside.back().global_step > complete ? &set_aside.back()
                                                                       : nullptr;
}

std::string CheckpointSummary::describe() const {
  const std::string how = checksums ? "verified" : "sizes match; checksums not read";
  std::string text;
  if (!newer_damaged.empty()) {
    const CheckpointInfo& newest = newer_damaged.front();
    text = "DAMAGED: " + printable(newest.name) + " (" + printable(newest.problem) + ")";
    if (newer_damaged.size() > 1)
      text += " and " + std::to_string(newer_damaged.size() - 1) + " older";
    text += newest_complete
                ? "; a resume takes " + printable(newest_complete->name) + " (" + how + ")"
                : "; no checkpoint is complete";
  } else if (newest_complete) {
    text = printable(newest_complete->name) + " (" + how + ")";
  } else {
    text = "none";
  }
  if (const CheckpointInfo* newer = lost())
    text += "; " + printable(newer->name) + ", newer, was set aside as damaged";
  else if (!set_aside.empty())
    text += "; " + std::to_string(set_aside.size()) + " older set aside as damaged";
  return text;
}

bool CheckpointView::has_checkpoints() const { return !checkpoint_folders(dir_).empty(); }

std::optional<CheckpointInfo> CheckpointView::newest_complete() const {
  CheckpointSummary s = summary(/*verify=*/true);
  for (const CheckpointInfo& info : s.newer_damaged)
    spdlog::warn("skipping {}, which does not verify ({}); trying the previous checkpoint",
                 printable(info.name), info.problem);
  return std::move(s.newest_complete);
}

const CheckpointInfo* CheckpointView::newest_complete(const std::vector<CheckpointInfo>& infos) {
  for (auto it = infos.rbegin(); it != infos.rend(); ++it) {
    if (it->complete) return &*it;
  }
  return nullptr;
}

int64_t CheckpointView::newest_complete_step() const {
  const std::vector<CheckpointInfo> infos = list(/*verify=*/false);
  const CheckpointInfo* newest = newest_complete(infos);
  return newest ? newest->global_step : -1;
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

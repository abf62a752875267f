#include "checkpoint/storage/folder_io.h"

#include <algorithm>
#include <cerrno>
#include <future>
#include <optional>
#include <tuple>
#include <utility>

#include <spdlog/spdlog.h>

#include "checkpoint/format/manifest.h"
#include "checkpoint/storage/store.h"
#include "gpurun/errors.h"
#include "util/text.h"

namespace gpurun {
namespace {

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
std::string check_file(const CheckpointStorage& storage, const std::string& folder,
                       const std::string& name, const json& entry, Check check,
                       ReadErrors read_errors, int64_t& bytes) {
  FileEntry want;
  if (std::string problem = parse_entry(name, entry, want); !problem.empty()) return problem;
  const std::string file = folder + "/" + name;
  int64_t size = 0;
  std::string got;
  try {
    // Before any read: a directory or a FIFO where a file belongs is damage (and a FIFO would
    // block the read).
    const StoredFile status = storage.status(file);
    if (status.size >= 0 && !status.regular) return name + ": not a regular file";
    if (check == Check::kSizes)
      size = status.size;
    else if (status.size >= 0)
      std::tie(size, got) = storage.checksum(file);
    else
      size = -1;
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

std::string read_manifest(const CheckpointStorage& storage, const std::string& folder,
                          ReadErrors read_errors, CheckpointInfo& info, std::string* text_out) {
  const std::string name = folder + "/" + kManifest;
  std::string text;
  try {
    const StoredFile status = storage.status(name);
    if (status.size < 0) return "manifest.json missing";
    if (!status.regular) return "manifest.json: not a regular file";
    text = storage.read_all(name);
  } catch (const IoError& e) {
    if (e.error_number() == ENOENT) return "manifest.json missing";
    if (read_errors == ReadErrors::kThrow) throw;
    return std::string(kManifest) + ": cannot be read (" + e.what() + ")";
  }
  std::string problem = check_manifest(text, info);
  if (problem.empty() && text_out) *text_out = std::move(text);
  return problem;
}

CheckpointInfo examine(const CheckpointStorage& storage, const std::string& folder, Check check,
                       ReadErrors read_errors) {
  CheckpointInfo info;
  info.path = storage.path(folder);
  info.name = folder;
  if (const auto parsed = parse_checkpoint_name(info.name)) {
    info.epoch = parsed->epoch;
    info.global_step = parsed->global_step;
  }
  info.problem = read_manifest(storage, folder, read_errors, info, nullptr);
  if (!info.problem.empty()) return info;

  // Checksums of the files at once, each on its own thread: a resume verifies its checkpoint
  // in about the time of its largest file (hashing runs at memory speed, so cores help).
  using Checked = std::pair<std::string, int64_t>;  // the problem, the file's bytes
  std::vector<std::future<Checked>> checked;
  for (const auto& [name, entry] : info.manifest.at("files").items()) {
    const auto launch = check == Check::kChecksums ? std::launch::async : std::launch::deferred;
    checked.push_back(std::async(launch, [&, name = name, &entry = entry] {
      int64_t bytes = 0;
      std::string problem = check_file(storage, folder, name, entry, check, read_errors, bytes);
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

CheckpointView::CheckpointView(std::string dir, ReadErrors read_errors)
    : CheckpointView(open_storage(dir), read_errors) {}

CheckpointView::CheckpointView(std::shared_ptr<CheckpointStorage> storage, ReadErrors read_errors)
    : dir_(storage->root()), storage_(std::move(storage)), read_errors_(read_errors) {}

std::vector<CheckpointInfo> CheckpointView::list(bool verify) const {
  std::vector<CheckpointInfo> out;
  for (const auto& name : storage_->folders()) {
    CheckpointInfo info = checkpoint_folder::examine(
        *storage_, name, verify ? Check::kChecksums : Check::kSizes, read_errors_);
    // Deleted by a live run's retention meanwhile: no longer there.
    if (!info.complete && !storage_->has_folder(name)) continue;
    out.push_back(std::move(info));
  }
  std::stable_sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.global_step != b.global_step ? a.global_step < b.global_step : a.name < b.name;
  });
  return out;
}

std::vector<CheckpointInfo> CheckpointView::set_aside() const {
  std::vector<CheckpointInfo> out;
  for (const auto& name : storage_->set_aside_names()) {
    CheckpointInfo info;
    info.name = name;
    info.path = storage_->path(name);
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
    CheckpointInfo info = verify && it->complete ? examine(it->name, /*verify=*/true) : *it;
    if (info.complete)
      s.newest_complete = std::move(info);
    else
      s.newer_damaged.push_back(std::move(info));
  }
  s.set_aside = set_aside();
  return s;
}

bool CheckpointView::has_checkpoints() const { return !storage_->folders().empty(); }

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
    latest.name = storage_->read_all(kLatest);
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

CheckpointInfo CheckpointView::examine(const std::string& name, bool verify) const {
  return checkpoint_folder::examine(*storage_, name, verify ? Check::kChecksums : Check::kSizes,
                                    read_errors_);
}

bool CheckpointView::is_checkpoint_folder(const std::string& path) {
  const auto [root, name] = split_folder_path(path);
  // By the name's pattern, not its prefix: a local tier is named after --ckpt, and a --ckpt
  // named "ckpt" gives it a name like ckpt-aeb66c32, which is a root.
  if (parse_checkpoint_name(name).has_value()) return true;
  return open_storage(root)->status(name + "/" + kManifest).size >= 0;
}

CheckpointInfo CheckpointView::inspect(const std::string& folder, bool verify,
                                       ReadErrors read_errors) {
  const auto [root, name] = split_folder_path(folder);
  CheckpointInfo info = checkpoint_folder::examine(
      *open_storage(root), name, verify ? Check::kChecksums : Check::kSizes, read_errors);
  info.path = folder;
  return info;
}

}  // namespace gpurun

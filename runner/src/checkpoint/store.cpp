#include "checkpoint/store.h"

#include "checkpoint/folder.h"
#include "checkpoint/manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>

#include <spdlog/spdlog.h>

#include "gpurun/errors.h"
#include "util/bracket.h"
#include "util/faults.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/text.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;
using namespace checkpoint_folder;

std::string pid_string() { return std::to_string(::getpid()); }

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

namespace checkpoint_folder {

FileSources file_sources(const CheckpointSnapshot& snapshot, const json& taken) {
  FileSources sources;
  for (const auto& [name, bytes] : snapshot.files)
    sources.emplace_back(
        name, [&bytes = bytes](const ByteSink& out) { out(bytes.data(), bytes.size()); });
  for (const auto& [name, source] : snapshot.streamed) sources.emplace_back(name, source);
  std::set<std::string> seen;
  for (const auto& [name, source] : sources) {
    if (!is_plain_name(name) || name == kManifest || taken.contains(name) ||
        !seen.insert(name).second) {
      throw std::invalid_argument("bad or duplicate checkpoint file name '" + name + "'");
    }
  }
  return sources;
}

json hash_sources(const FileSources& sources) {
  json files = json::object();
  for (const auto& [name, source] : sources) {
    Xxh3 hash;
    int64_t bytes = 0;
    source([&](const char* data, size_t size) {
      hash.update(data, size);
      bytes += static_cast<int64_t>(size);
    });
    files[name] = {{"bytes", bytes}, {"xxh3", hash.hex()}};
  }
  return files;
}

int64_t write_sources(const std::string& dir, const FileSources& sources, json& files) {
  int64_t bytes = 0;
  for (const auto& [name, source] : sources) {
    std::optional<Xxh3> hash;  // started over when a transient error makes the write retry
    const int64_t n = fs::write_streamed(
        join(dir, name), source, [&](const char* data, size_t size) { hash->update(data, size); },
        [&] { hash.emplace(); });
    files[name] = {{"bytes", n}, {"xxh3", hash->hex()}};
    bytes += n;
  }
  return bytes;
}

}  // namespace checkpoint_folder

CheckpointStore::CheckpointStore(std::string dir, int64_t keep_last)
    : dir_(std::move(dir)), keep_last_(keep_last), view_(dir_, ReadErrors::kThrow) {
  if (keep_last_ < 1) {
    throw std::invalid_argument("checkpoint keep_last must be >= 1, got " +
                                std::to_string(keep_last_));
  }
}

SaveResult CheckpointStore::save(const CheckpointSnapshot& snapshot) {
  if (!snapshot.shard_folder.empty()) return save_sharded(snapshot);
  const FileSources sources = file_sources(snapshot);
  const std::string name = checkpoint_name(snapshot.meta.epoch, snapshot.meta.global_step);
  return commit(
      name, [&] { return hash_sources(sources); }, {"before_rename", "before_latest", ++saves_},
      [&](const std::string& tmp) {
        // Each file streamed from its source to the disk, its xxh3 computed as the bytes pass:
        // the manifest needs no second read.
        json files = json::object();
        const int64_t bytes = write_sources(tmp, sources, files);
        fs::write_file(join(tmp, kManifest), manifest_text(snapshot.meta, files));
        return bytes;
      });
}

void CheckpointSnapshot::materialize() {
  for (auto& [name, source] : streamed) {
    std::string bytes;
    source([&](const char* data, size_t size) { bytes.append(data, size); });
    files.emplace_back(std::move(name), std::move(bytes));
  }
  streamed.clear();
}

SaveResult CheckpointStore::copy_from(const std::string& folder,
                                      const std::function<void()>& between_chunks) {
  CheckpointInfo source;
  source.path = folder;
  source.name = stdfs::path(folder).lexically_normal().filename().string();
  // The manifest travels unchanged: both tiers then describe the same checkpoint, byte for byte.
  std::string manifest_bytes;
  const std::string problem = read_manifest(folder, ReadErrors::kThrow, source, &manifest_bytes);
  if (!problem.empty() || !is_checkpoint_folder_name(source.name)) {
    throw ResumeError("checkpoint " + folder + " cannot be copied: " +
                      (problem.empty() ? "not a checkpoint folder name" : problem));
  }
  const json& files = source.manifest.at("files");
  return commit(
      source.name, [&] { return files; }, {"copy_before_rename", "copy_before_latest", ++copies_},
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
            return fs::copy_file(join(folder, file_name), join(tmp, file_name),
                                 [&](const char* data, size_t size) {
                                   hash->update(data, size);
                                   if (between_chunks) between_chunks();
                                 });
          });
          if (n != want.bytes || hash->hex() != want.xxh3) {
            throw ResumeError("checkpoint " + folder + " cannot be copied: " + file_name +
                              " does not match its manifest (" + std::to_string(n) +
                              " bytes, xxh3 " + hash->hex() + ")");
          }
          bytes += n;
        }
        fs::write_file(join(tmp, kManifest), manifest_bytes);
        return bytes;
      });
}

SaveResult CheckpointStore::commit(const std::string& name, const FilesTable& files,
                                   const FaultPoints& faults,
                                   const std::function<int64_t(const std::string&)>& fill) {
  const auto start = std::chrono::steady_clock::now();
  SaveResult result;
  result.path = join(dir_, name);
  fs::make_dirs(dir_);
  {
    const Bracket writing(write_hook_);
    result.bytes = write_folder(name, files, faults, fill);
  }

  // Should this throw, the new checkpoint is complete but LATEST still names the previous one;
  // load_latest() goes by verified manifests, not by LATEST, so both states resume correctly.
  fault_point(faults.before_latest, faults.attempt);
  fs::replace_file(join(dir_, kLatest), name + "\n");
  result.write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.removed = apply_retention(name);
  return result;
}

int64_t CheckpointStore::write_folder(const std::string& name, const FilesTable& files,
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
      if (existing.manifest.at("files") == files()) {
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

std::optional<LoadedCheckpoint> CheckpointStore::load_latest(bool verify) {
  const std::vector<CheckpointInfo> all = view_.list(/*verify=*/false);
  if (all.empty()) {
    // Only checkpoints set aside as damaged (by an earlier resume): starting fresh would
    // silently throw that run away, the more so in a restart loop. A person decides.
    const std::vector<CheckpointInfo> aside = view_.set_aside();
    if (aside.empty()) return std::nullopt;
    std::string message = "no complete checkpoint in " + dir_ +
                          ", only checkpoints set aside as "
                          "damaged by an earlier resume:";
    for (const auto& info : aside) message += "\n  " + printable(info.name);
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
      CheckpointInfo info = verify ? examine(it->path, Check::kChecksums, ReadErrors::kThrow) : *it;
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

  if (!loaded->info.sealed)
    spdlog::warn(
        "checkpoint {} has a manifest of format_version 1, which carries no checksum of its "
        "own: only its epoch and global step were checked against the folder's name (the "
        "checkpoints this run writes from now on are sealed)",
        loaded->info.path);
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

void CheckpointStore::set_aside_damaged(const CheckpointInfo& info, const std::string& problem) {
  std::string aside;
  try {
    aside = set_aside(dir_, info.name);
  } catch (const IoError& e) {
    throw ResumeError("checkpoint " + info.path + " is damaged (" + problem +
                      ") and could not be renamed aside (" + e.what() +
                      "); move it away, then resume again");
  }
  spdlog::warn("checkpoint {} is damaged ({}); renamed to {}; trying the previous one", info.path,
               problem, aside);
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

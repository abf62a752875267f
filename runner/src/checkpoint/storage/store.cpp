#include "checkpoint/storage/store.h"

#include "checkpoint/format/manifest.h"
#include "checkpoint/format/metric_rank.h"
#include "checkpoint/storage/folder_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

using json = nlohmann::json;
using namespace checkpoint_folder;

namespace {
/// Folders retention removed in this process, every store together: the N of the test-only
/// fault point "retention_remove".
std::atomic<int64_t> retention_removals{0};
}  // namespace

namespace checkpoint_folder {

int64_t write_sources(FolderWrite& folder, const FileSources& sources, json& files) {
  int64_t bytes = 0;
  for (const auto& [name, source] : sources) {
    std::optional<Xxh3> hash;  // started over when a transient error makes the write retry
    const int64_t n = folder.write(
        name, source, [&](const char* data, size_t size) { hash->update(data, size); },
        [&] { hash.emplace(); });
    files[name] = {{"bytes", n}, {"xxh3", hash->hex()}};
    bytes += n;
  }
  return bytes;
}

}  // namespace checkpoint_folder

CheckpointStore::CheckpointStore(std::string dir, int64_t keep_last)
    : CheckpointStore(open_storage(dir), keep_last) {}

CheckpointStore::CheckpointStore(std::shared_ptr<CheckpointStorage> storage, int64_t keep_last)
    : dir_(storage->root()),
      storage_(storage),
      keep_last_(keep_last),
      view_(std::move(storage), ReadErrors::kThrow) {
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
      [&](FolderWrite& folder) {
        json files = json::object();
        const int64_t bytes = write_sources(folder, sources, files);
        return Filled{bytes, manifest_text(snapshot.meta, files)};
      });
}

SaveResult CheckpointStore::copy_from(const std::string& folder,
                                      const std::function<void()>& between_chunks) {
  const auto [root, name] = split_folder_path(folder);
  return copy_from(*open_storage(root), name, between_chunks);
}

SaveResult CheckpointStore::copy_from(const CheckpointStorage& from, const std::string& name,
                                      const std::function<void()>& between_chunks) {
  CheckpointInfo source;
  source.path = from.path(name);
  source.name = name;
  std::string manifest_bytes;
  const std::string problem =
      read_manifest(from, name, ReadErrors::kThrow, source, &manifest_bytes);
  if (!problem.empty() || !is_checkpoint_folder_name(source.name)) {
    throw ResumeError("checkpoint " + source.path + " cannot be copied: " +
                      (problem.empty() ? "not a checkpoint folder name" : problem));
  }
  const json& files = source.manifest.at("files");
  return commit(
      source.name, [&] { return files; }, {"copy_before_rename", "copy_before_latest", ++copies_},
      [&](FolderWrite& folder) {
        int64_t bytes = 0;
        for (const auto& [file_name, entry] : files.items()) {
          FileEntry want;
          if (std::string bad = parse_entry(file_name, entry, want); !bad.empty())
            throw ResumeError("checkpoint " + source.path + " cannot be copied: " + bad);
          // Checked against the source's manifest as the bytes pass: a copy never makes a
          // damaged checkpoint complete in another tier.
          std::optional<Xxh3> hash;
          const std::string file = name + "/" + file_name;
          const int64_t n = folder.write(
              file_name, [&](const ByteSink& out) { from.read(file, out); },
              [&](const char* data, size_t size) {
                hash->update(data, size);
                if (between_chunks) between_chunks();
              },
              [&] { hash.emplace(); });
          if (n != want.bytes || hash->hex() != want.xxh3) {
            throw ResumeError("checkpoint " + source.path + " cannot be copied: " + file_name +
                              " does not match its manifest (" + std::to_string(n) +
                              " bytes, xxh3 " + hash->hex() + ")");
          }
          bytes += n;
        }
        return Filled{bytes, manifest_bytes};
      });
}

SaveResult CheckpointStore::commit(const std::string& name, const FilesTable& files,
                                   const FaultPoints& faults, const Fill& fill) {
  const auto start = std::chrono::steady_clock::now();
  SaveResult result;
  result.path = storage_->path(name);
  {
    const Bracket writing(write_hook_);
    result.bytes = write_folder(name, files, faults, fill);
  }
  // LATEST last: a hint written once the checkpoint is complete, never before.
  fault_point(faults.before_latest, faults.attempt);
  storage_->replace(kLatest, name + "\n");
  result.write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.removed = apply_retention(name);
  return result;
}

int64_t CheckpointStore::write_folder(const std::string& name, const FilesTable& files,
                                      const FaultPoints& faults, const Fill& fill) {
  const std::string final_path = storage_->path(name);
  // A complete checkpoint is never overwritten: a run that resumed from an older one and
  // saves the same step again keeps what is there.
  if (storage_->has_folder(name)) {
    const CheckpointInfo existing = examine(*storage_, name, Check::kChecksums, ReadErrors::kThrow);
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
  std::unique_ptr<FolderWrite> folder = storage_->write_folder(name);
  try {
    const Filled filled = fill(*folder);
    folder->commit(
        filled.manifest,
        [&] {
          fault_point(faults.before_rename, faults.attempt);
          if (storage_->has_folder(name))
            spdlog::warn("replacing {}, which does not verify", final_path);
        },
        commit_mutex_);
    return filled.bytes;
  } catch (...) {
    folder->abort();
    throw;
  }
}

std::vector<std::string> CheckpointStore::apply_retention(const std::string& just_written) {
  // Its failures are logged, not thrown: the new checkpoint is complete. A manifest that cannot
  // be read throws (the view reads with ReadErrors::kThrow), so nothing is deleted on a ranking
  // that storage trouble made uncertain.
  std::vector<std::string> removed;
  try {
    const std::vector<CheckpointInfo> all = view_.list(/*verify=*/false);
    std::vector<const CheckpointInfo*> complete;
    for (const auto& info : all) {
      if (info.complete) complete.push_back(&info);
    }
    const bool keep_best = !keep_best_.metric.empty();
    std::vector<bool> best(complete.size(), false);
    if (keep_best) {
      std::vector<std::optional<double>> values;
      for (const CheckpointInfo* info : complete)
        values.push_back(manifest_metric(info->manifest, keep_best_.metric));
      for (const size_t i : best_indices(values, keep_best_.mode, keep_best_.k)) best[i] = true;
    }
    const int64_t newest_step = complete.empty() ? -1 : complete.back()->global_step;
    const size_t keep_from =
        complete.size() > static_cast<size_t>(keep_last_) ? complete.size() - keep_last_ : 0;
    std::vector<const CheckpointInfo*> doomed;
    for (size_t i = 0; i < keep_from; ++i)
      if (!best[i]) doomed.push_back(complete[i]);
    for (const auto& info : all) {
      if (info.complete || info.global_step >= newest_step) continue;
      if (!keep_best) {
        doomed.push_back(&info);
      } else if (std::find(kept_incomplete_.begin(), kept_incomplete_.end(), info.name) ==
                 kept_incomplete_.end()) {
        kept_incomplete_.push_back(info.name);
        spdlog::warn(
            "retention: keeping {}, which is incomplete ({}): with checkpoint.keep_best on, its "
            "{} cannot be ranked, and it may be one of the best; check it with `gpurun ckpt "
            "verify {}` and remove it by hand",
            info.path, info.problem, keep_best_.metric, dir_);
      }
    }
    for (const CheckpointInfo* info : doomed) {
      if (info->name == just_written) continue;
      if (retention_guard_ && retention_guard_(info->name)) continue;  // being copied
      try {
        fault_point("retention_remove", retention_removals.load());
        storage_->remove_folder(info->name);
        ++retention_removals;
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
      CheckpointInfo info =
          verify ? examine(*storage_, it->name, Check::kChecksums, ReadErrors::kThrow) : *it;
      if (info.complete) {
        CheckpointMeta meta = meta_from_manifest(info.manifest);
        loaded = LoadedCheckpoint{std::move(info), std::move(meta), {}};
        break;
      }
      problem = info.problem;
    }
    std::string where;
    try {
      where = "set aside as " + storage_->set_aside(it->name);
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
      storage_->replace(kLatest, loaded->info.name + "\n");
    } catch (const IoError& e) {
      spdlog::warn("could not correct LATEST: {}", e.what());
    }
  }
  return loaded;
}

void CheckpointStore::set_aside_damaged(const CheckpointInfo& info, const std::string& problem) {
  std::string aside;
  try {
    aside = storage_->set_aside(info.name);
  } catch (const IoError& e) {
    throw ResumeError("checkpoint " + info.path + " is damaged (" + problem +
                      ") and could not be renamed aside (" + e.what() +
                      "); move it away, then resume again");
  }
  spdlog::warn("checkpoint {} is damaged ({}); set aside as {}; trying the previous one", info.path,
               problem, aside);
}

LoadedCheckpoint CheckpointStore::load(const std::string& path) {
  CheckpointInfo info = CheckpointView::inspect(path, /*verify=*/true, ReadErrors::kThrow);
  if (!info.complete) throw ResumeError("checkpoint " + path + " does not verify: " + info.problem);
  CheckpointMeta meta = meta_from_manifest(info.manifest);
  return LoadedCheckpoint{std::move(info), std::move(meta), {}};
}

std::unique_lock<std::timed_mutex> CheckpointStore::hold_commits(double seconds) {
  std::unique_lock<std::timed_mutex> lock(commit_mutex_, std::defer_lock);
  (void)lock.try_lock_for(std::chrono::duration<double>(seconds));
  return lock;
}

void CheckpointStore::clean_temporaries() { storage_->clean_temporaries(); }

}  // namespace gpurun

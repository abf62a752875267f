// CheckpointStore's share of a sharded save (store.h): the folder the ranks write their shard
// files into, and the save that makes them part of a checkpoint with the protocol of save().
#include <unistd.h>

#include <set>
#include <stdexcept>
#include <string>

#include "checkpoint/format/manifest.h"
#include "checkpoint/storage/folder_io.h"
#include "checkpoint/storage/store.h"
#include "gpurun/errors.h"
#include "util/faults.h"
#include "util/fs.h"
#include "util/hash.h"

namespace gpurun {

using namespace checkpoint_folder;

std::string CheckpointStore::shard_folder(const std::string& name) {
  // The ranks write their shards with the file system's calls (O_DIRECT, fsync): an object
  // root is always behind a local tier that takes the sharded saves (Checkpointer).
  if (!storage_->is_local())
    throw ConfigError(
        "a sharded save to " + dir_ +
        " needs the local tier: set checkpoint.local_dir to a local folder, not none");
  const std::string folder = join(dir_, ".tmp-" + name + "-shards-" + std::to_string(::getpid()));
  fs::make_dirs(dir_);
  fs::remove_all(folder);  // left by an earlier process that had the same pid
  fs::make_dirs(folder);
  return folder;
}

SaveResult CheckpointStore::save_sharded(const CheckpointSnapshot& snapshot) {
  const FileSources sources = file_sources(snapshot, snapshot.shard_files);
  const std::string name = checkpoint_name(snapshot.meta.epoch, snapshot.meta.global_step);
  const int64_t attempt = ++saves_;
  const auto all_files = [&] {
    nlohmann::json files = snapshot.shard_files;
    files.update(hash_sources(sources));
    return files;
  };
  SaveResult result;
  try {
    result = commit(name, all_files, {"before_rename", "before_latest", attempt},
                    [&](FolderWrite& folder) {
                      int64_t bytes = 0;
                      // The shards are written and fsynced by their ranks.
                      for (const auto& [shard, entry] : snapshot.shard_files.items()) {
                        folder.adopt(shard, join(snapshot.shard_folder, shard));
                        bytes += entry.at("bytes").get<int64_t>();
                      }
                      // The other files streamed beside them, hashed as they pass.
                      nlohmann::json files = snapshot.shard_files;
                      bytes += write_sources(folder, sources, files);
                      fault_point("before_manifest", attempt);
                      return Filled{bytes, manifest_text(snapshot.meta, files)};
                    });
  } catch (...) {
    fs::remove_all(snapshot.shard_folder);
    throw;
  }
  // Empty once its files moved; left with them when a complete checkpoint of that name was kept.
  fs::remove_all(snapshot.shard_folder);
  return result;
}

}  // namespace gpurun

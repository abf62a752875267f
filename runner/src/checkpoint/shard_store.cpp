// CheckpointStore's share of a sharded save (store.h): the folder the ranks write their shard
// files into, and the save that makes them part of a checkpoint with the protocol of save().
#include <unistd.h>

#include <set>
#include <stdexcept>

#include "checkpoint/folder.h"
#include "checkpoint/manifest.h"
#include "checkpoint/store.h"
#include "util/faults.h"
#include "util/fs.h"
#include "util/hash.h"

namespace gpurun {

using namespace checkpoint_folder;

std::string CheckpointStore::shard_folder(const std::string& name) {
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
                    [&](const std::string& tmp) {
                      int64_t bytes = 0;
                      // The shards are written and fsynced by their ranks: a rename within
                      // the file system moves them, and the folder's fsync makes it durable.
                      for (const auto& [shard, entry] : snapshot.shard_files.items()) {
                        fs::rename_durable(join(snapshot.shard_folder, shard), join(tmp, shard));
                        bytes += entry.at("bytes").get<int64_t>();
                      }
                      // The other files streamed beside them, hashed as they pass.
                      nlohmann::json files = snapshot.shard_files;
                      bytes += write_sources(tmp, sources, files);
                      fault_point("before_manifest", attempt);
                      fs::write_file(join(tmp, kManifest), manifest_text(snapshot.meta, files));
                      return bytes;
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

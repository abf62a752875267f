// A checkpoint folder's parts, wherever it is stored: names, the manifest's file entries and the
// sources of a snapshot's files. checkpoint/storage/folder_io.h lists, writes and examines
// folders in a CheckpointStorage (docs/architecture.md, "Checkpoint directory").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/format/checkpoint_types.h"

namespace gpurun::checkpoint_folder {

inline constexpr const char* kManifest = "manifest.json";
inline constexpr const char* kLatest = "LATEST";

/// dir + "/" + name (no doubled slash).
std::string join(const std::string& dir, const std::string& name);

/// The last component of a checkpoint folder's path, trailing slashes and dots resolved:
/// "runs/x/ckpt-e0002-s0000128/" -> "ckpt-e0002-s0000128".
std::string name_of(const std::string& path);

/// A file name inside a checkpoint folder: one plain path component.
bool is_plain_name(const std::string& name);

/// A file's entry in a manifest's files table.
struct FileEntry {
  int64_t bytes = 0;
  std::string xxh3;
};

/// Reads the manifest entry of file `name` into `out`; returns the problem with it, "" when it
/// is usable: a name that is not one plain path component (or is the manifest's own), or an
/// entry without an integer `bytes` and a string `xxh3`.
std::string parse_entry(const std::string& name, const nlohmann::json& entry, FileEntry& out);

/// The files of a snapshot as a save writes them: each name with the source of its bytes.
using FileSources = std::vector<std::pair<std::string, ByteSource>>;

/// Every file of `snapshot` (`files`, then `streamed`) with its source. Throws
/// std::invalid_argument, before anything is written, for a name that is not one plain path
/// component, the manifest's own, a duplicate, or one of `taken`'s (a sharded save's shards).
FileSources file_sources(const CheckpointSnapshot& snapshot,
                         const nlohmann::json& taken = nlohmann::json::object());

/// The manifest's entries, {name: {bytes, xxh3}}, of `sources` run without writing anything.
nlohmann::json hash_sources(const FileSources& sources);

}  // namespace gpurun::checkpoint_folder

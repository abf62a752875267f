// A checkpoint folder on disk, as the view (view.cpp) reads and verifies it and the store
// (store.cpp) writes and copies it: names, the manifest and the check of every file against it.
// Internal to checkpoint/: store.h is the interface (docs/architecture.md, "Checkpoint
// directory").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/store.h"

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

/// The names in `dir` that are checkpoint folders (is_checkpoint_folder_name), unsorted; none
/// when `dir` does not exist.
std::vector<std::string> checkpoint_folders(const std::string& dir);

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

/// Streams each source into DIR/name (fs::write_streamed(): no image of the file, one fsync),
/// its xxh3 computed as the bytes pass, and adds its entry to `files`. Returns the bytes
/// written. Throws IoError.
int64_t write_sources(const std::string& dir, const FileSources& sources, nlohmann::json& files);

/// How much of a checkpoint examine() checks: the files' sizes, or their xxh3 too.
enum class Check { kSizes, kChecksums };

/// Reads PATH/manifest.json and checks every file it lists: its size, and with kChecksums its
/// xxh3 (each file read once, in chunks, the files at once on their own threads). What is
/// wrong goes to `problem`. A missing file, or one that is not a regular file, is a problem;
/// other I/O errors (EIO after retries, EACCES) are a problem or thrown, as `read_errors` says.
CheckpointInfo examine(const std::string& path, Check check, ReadErrors read_errors);

}  // namespace gpurun::checkpoint_folder

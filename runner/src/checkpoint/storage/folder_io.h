// A checkpoint folder in storage: the folders of a root, a snapshot's files written into one,
// and one examined against its manifest. Internal to checkpoint/storage/: store.h is the
// interface (docs/architecture.md, "Checkpoint directory").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/format/checkpoint_types.h"
#include "checkpoint/format/folder.h"
#include "checkpoint/storage/checkpoint_storage.h"

namespace gpurun::checkpoint_folder {

/// Streams each source into the folder being written, its xxh3 computed as the bytes pass,
/// and adds its entry to `files`. Returns the bytes written. Throws IoError.
int64_t write_sources(FolderWrite& folder, const FileSources& sources, nlohmann::json& files);

/// Reads and checks the manifest of the folder `folder` of `storage` into `info`
/// (check_manifest()), and its bytes into `text_out` when given. Returns the problem that makes
/// the checkpoint incomplete, "" when the manifest is usable. A manifest that cannot be read is
/// a problem, or an IoError thrown, as `read_errors` says.
std::string read_manifest(const CheckpointStorage& storage, const std::string& folder,
                          ReadErrors read_errors, CheckpointInfo& info,
                          std::string* text_out = nullptr);

/// How much of a checkpoint examine() checks: the files' sizes, or their xxh3 too.
enum class Check { kSizes, kChecksums };

/// Reads the manifest of the folder `folder` of `storage` and checks every file it lists: its size,
/// and with kChecksums its xxh3 (each file read once, in chunks, the files at once on their own
/// threads). What is wrong goes to `problem`. A missing file, or one that is not a regular file, is
/// a problem; other I/O errors (EIO after retries, EACCES) are a problem or thrown, as
/// `read_errors` says.
CheckpointInfo examine(const CheckpointStorage& storage, const std::string& folder, Check check,
                       ReadErrors read_errors);

}  // namespace gpurun::checkpoint_folder

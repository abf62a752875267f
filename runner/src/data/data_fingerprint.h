// What a run's data is, recorded in every checkpoint's manifest (extra.data) so that a resume
// over other data is caught: the files that data.path and data.eval_path name (for tokens, the
// val.bin beside data.path too), as a count, a total size, an xxh3 over their relative paths
// and sizes and the newest mtime, and the samples of each split. A file added, removed, grown
// or shrunk, or another sample count, is a change; a newer mtime alone is not (a new instance
// that downloads the same data again has new mtimes) and is only said.
// No Torch headers here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpurun/config.h"

namespace gpurun {

struct DataFingerprint {
  /// One configured path: a file, or a directory's regular files, recursively.
  struct Source {
    std::string key;   ///< "data.path", "data.eval_path", "data.eval_path (val.bin beside ...)"
    std::string path;  ///< as resolved (config/paths.h)
    int64_t files = 0;
    int64_t bytes = 0;
    std::string listing_xxh3;  ///< xxh3-64 over the sorted "relative path\0size\0" of each file
    double newest_mtime = 0;   ///< unix seconds of the newest file
    /// The files' relative paths and sizes when there are at most kListedFiles, to name which
    /// changed; empty otherwise.
    std::vector<std::pair<std::string, int64_t>> listed;
  };
  std::vector<Source> sources;
  int64_t train_samples = 0, eval_samples = 0;

  static constexpr int64_t kListedFiles = 64;

  nlohmann::json to_json() const;
  /// Inverse of to_json(); throws nlohmann::json::exception on another shape.
  static DataFingerprint from_json(const nlohmann::json& j);
};

/// The fingerprint of `data` (data.path and data.eval_path resolved, before data.stage_dir
/// points them at copies) with its splits' sample counts. The synthetic data set has no files.
/// A path that does not exist has no files (the data set's own error names it).
DataFingerprint fingerprint_data(const DataConfig& data, int64_t train_samples,
                                 int64_t eval_samples);

/// How `now` differs from `saved`: each change in words ("data.path /d/train.bin: 6.0 KB, was
/// 4.0 KB", "train samples: 3000, was 2000", "data.path /d: 2 files added: a.png, b.png"),
/// and what changed only its mtime. Both empty: the same data.
struct DataChange {
  std::vector<std::string> changes;
  std::vector<std::string> touched;  ///< paths whose files are the same, with newer mtimes
};
DataChange compare_data(const DataFingerprint& saved, const DataFingerprint& now);

}  // namespace gpurun

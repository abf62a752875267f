// data.stage_dir: the data set's files copied from data.path (often network storage) to a
// local disk before training, so that every epoch reads the local copy.
//
//   STAGE_DIR/<basename of SOURCE>-<8 hex digits of xxh3(absolute SOURCE)>/
//       the copy: SOURCE's regular files under the same relative paths (a file SOURCE: itself)
//       .gpurun-stage.json   per file: bytes, the source's mtime (ns) and the copy's xxh3
//
// A file is reused when the source still has the recorded size and mtime (rsync's quick check:
// reading the source again to hash it would cost what the copy costs) and the local copy still
// has the recorded size and xxh3; otherwise it is copied again. Each copy goes to a temporary
// name, is hashed as it passes and again as written, and is renamed into place only when both
// agree with each other and with the source's size. Processes sharing one stage dir (the ranks
// of one machine) take turns through an flock(2), so that one copies and the others reuse.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "gpurun/config.h"

namespace gpurun {

/// What staging one path did.
struct StageResult {
  std::string source;        ///< the path as configured
  std::string copy;          ///< where training reads it now
  int64_t files = 0;         ///< regular files of the source
  int64_t bytes = 0;         ///< their total size
  int64_t copied_files = 0;  ///< copied this time; the others were reused
  int64_t copied_bytes = 0;  ///< bytes copied this time
  double seconds = 0;        ///< wall time of the whole staging, checks included
  nlohmann::json to_json() const;
  /// "staged data.path SOURCE in COPY: 4 files, 29.9 MiB; 4 copied (29.9 MiB in 0.31 s, ...)"
  std::string describe(const std::string& key) const;
};

/// Stages `source` (a file, or a directory whose regular files are staged recursively) into
/// `stage_dir` as described above; progress is logged every 2 s while it copies. Throws
/// ConfigError naming `key` when the source does not exist, IoError when a copy fails (the
/// copies of the files done so far are kept and reused on the next start).
StageResult stage_path(const std::string& source, const std::string& stage_dir,
                       const std::string& key);

/// data.stage_dir for a run: stages data.path, and data.eval_path when set, into
/// data.stage_dir, points `data` at the copies and logs what it did (`log`). The synthetic
/// data set reads no files: nothing is staged. Returns a to_json() per path. Throws
/// ConfigError naming the key: a stage dir inside the source, a missing source, a copy that
/// failed (a full disk: with the bytes it needs).
nlohmann::json stage_data(DataConfig& data, bool log);

/// Where data in a bucket (data.path: s3://...) is staged without data.stage_dir:
/// fs::cache_dir()/data.
std::string default_stage_dir();

}  // namespace gpurun

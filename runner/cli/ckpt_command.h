// `gpurun ckpt list|verify|inspect DIR [--json]` (docs/architecture.md, "Command line").
//
//   list     every ckpt-* folder of the checkpoint root DIR: epoch, global step, bytes, and
//            "sizes ok" (the manifest's own checksum matches, its epoch and step agree with the
//            folder's name, every file it names is there at its size) or what is wrong, which
//            one LATEST names, and the folders a resume set aside (NAME.damaged). The files'
//            checksums are not read, and the output says so. --json: {"dir", "checked":
//            "sizes", "checkpoints": [{..., "complete", "problem", "sealed"}], "set_aside":
//            [{"name", "path", "epoch", "global_step"}], "latest", "newest_complete"}.
//   verify   checks every checkpoint in DIR (and in its local tier on this machine), checksums
//            included, prints each result (a file that cannot be read, or is not a file, fails
//            its checkpoint, not the command), the folders set aside and the checkpoint a
//            resume takes. --json: {"dir", "ok", "checked": "checksums", "failed",
//            "checkpoints": [{"name", "complete", "problem", "sealed"}], "set_aside",
//            "newest_complete"}. Exit 0 only when every checkpoint of both tiers verifies and
//            DIR holds one; 1 when any fails or DIR holds none (folders already set aside as
//            damaged are shown, and count for neither). So `gpurun ckpt verify DIR || alert`
//            catches any damage, the newest checkpoint's included.
//   inspect  DIR is the checkpoint root (meaning its newest complete checkpoint) or one ckpt-*
//            folder; prints that checkpoint's manifest: --json the manifest itself, otherwise a
//            readable summary. Newer checkpoints of a root that do not verify are skipped with a
//            warning. Exit 0 when it verifies, 1 when the folder's manifest is readable
//            but the checkpoint does not verify.
//
// The one report goes to `out` (stdout in the binary); with --json `out` receives exactly one
// JSON object (on an error, run_command() prints it: command_line.h). Names and LATEST read
// from disk are printed escaped (util/text.h). Diagnostics go to spdlog, which main() points at
// stderr.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "checkpoint/storage/store.h"

namespace gpurun {

/// The local tier (checkpoint.local_dir) of the run that writes the root `view`, when this
/// machine has it: named by the newest of `infos` (view.list()) whose manifest names it, or by
/// DIR/status.json while no checkpoint reached DIR yet; "" otherwise.
std::string local_tier_of(const CheckpointView& view, const std::vector<CheckpointInfo>& infos);

/// Runs `gpurun ckpt ACTION DIR [--json]` and returns the process exit code.
/// Throws ConfigError (exit 2) for an unknown action or a DIR that is missing or not a
/// directory, ResumeError (exit 3) for `inspect` when there is no checkpoint manifest to show
/// (a root without a complete checkpoint, a folder without a readable manifest.json), and
/// IoError (exit 1) when the storage fails.
int ckpt_command(const std::string& action, const std::string& dir, bool json, std::ostream& out);

}  // namespace gpurun

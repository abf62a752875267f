// Test-only fault injection, driven by the environment so that tests run the real binary:
//
//   GPURUN_FAULT=ACTION:POINT:N[,ACTION:POINT:N...]
//     ACTION  sigkill (the process SIGKILLs itself) | abort (SIGABRT, like a crash) |
//             exit1 (exit code 1) | sigterm (a stop request, as from `kill`) |
//             sleepMS (sleeps MS milliseconds: slow storage, a hang) |
//             hog (the trainer allocates device memory, leaving its next step half the room
//             it needs, so that the step meets a real out-of-memory error in the allocator)
//     POINT   after_step (N = optimizer steps completed) | after_save (N = saves completed
//             by this process) | before_rename (N = saves started by this process; fires
//             after every file of the checkpoint is written, before the folder is renamed) |
//             before_latest (same N; after the rename, before LATEST is replaced) |
//             copy_before_rename, copy_before_latest (the same two moments of the copy of a
//             checkpoint from checkpoint.local_dir to --ckpt; N = copies started) |
//             shard_write (a sharded save: every rank, after the first section of its shard
//             file is written; N = shard writes started by this process) | before_manifest
//             (a sharded save, rank 0: every file but the manifest is in the temporary
//             folder; N = saves started, as before_rename's) | s3_upload (an upload to an
//             s3:// root took in another 8 MiB, its parts in flight; N = 8 MiB pieces taken in
//             by this process's uploads) | retention_remove (retention is about to remove
//             a checkpoint folder; N = folders retention removed before it in this process,
//             so 1 fires between its first and second removal)
//     N       a count, or * for every occurrence
//
// Faults fire only in processes whose GPURUN_RESTART_COUNT is listed in GPURUN_FAULT_RESTART
// (comma-separated, default "0"), so a supervised restart runs clean.
//
//   GPURUN_TEST_EVAL_LOSS=V0,V1,...
//     Test-only scripted evaluation: epoch i's eval_loss is Vi (the model's real one for an
//     epoch past the list), in every process of the run, a resumed one included, so that
//     keep_best and early_stop can be tested on values chosen in advance.
#pragma once

#include <cstdint>
#include <optional>

namespace gpurun {

/// Fires the configured fault when `point` reaches `count`. No-op without GPURUN_FAULT.
void fault_point(const char* point, int64_t count);

/// Whether the caller's own action `action` (hog: the trainer takes memory from under its plan)
/// is configured for `point` at `count`. The caller carries it out.
bool fault_fires(const char* action, const char* point, int64_t count);

/// GPURUN_TEST_EVAL_LOSS's value for the 0-based `epoch`; nullopt without it or past its list.
std::optional<double> scripted_eval_loss(int64_t epoch);

}  // namespace gpurun

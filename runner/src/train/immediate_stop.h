// A second interrupt while training goes on (util/signals.h): the stop recorded at once, on the
// signal thread, at the step the training thread reached.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace gpurun {

class Checkpointer;
class Reporter;

/// Records the stop by signal `sig` at global step `step` of epoch `epoch` (the `signal` event
/// with `immediate`, the `done` event, status.json "stopped"), naming on rank 0 the newest
/// complete checkpoint of `checkpointer`'s tiers, whose commits it holds until the process
/// exits, so that what it says is saved stays true; the process then exits 75. `attempt` is
/// the cost ledger's this_attempt() for the `done` event (train/cost_ledger.h). Reads only what
/// is safe from another thread: its arguments and the files.
void record_immediate_stop(int sig, int64_t step, int64_t epoch, int rank,
                           Checkpointer& checkpointer, Reporter& reporter,
                           const std::string& ckpt_dir, const nlohmann::json& attempt);

}  // namespace gpurun

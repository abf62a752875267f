// Settings that are valid but probably not what the user meant. They can only be judged once
// the data is loaded and the device's memory is known, so config validation cannot refuse
// them; open_session() warns about them instead.
#pragma once

#include <cstdint>

#include "gpurun/config.h"

namespace gpurun {

struct Session;

/// Logs a warning (spdlog) for each suspicious setting that `session` (its data loaded and its
/// meter installed) reveals:
///  - train.batch_size larger than the training set: every epoch is a single optimizer step;
///  - a memory limit above the device's own memory (MemoryMeter::device_bytes()): on the CPU
///    the plan then counts on memory the machine does not have; on CUDA the limit is ignored.
/// `memory_limit`: --memory-limit in bytes, 0 when not given (memory.capacity is then the
/// limit, when it is a size).
void warn_about_suspicious_settings(const RunConfig& config, const Session& session,
                                    int64_t memory_limit);

}  // namespace gpurun

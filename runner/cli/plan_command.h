// `gpurun plan CONFIG [--memory-limit SIZE] [--json]`: what the run needs and where it fits.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "gpurun/config.h"

namespace gpurun {

class Registry;

/// Measures the configured run (the probes of memory_plan.h on the real model and data),
/// prints the chosen plan for this device, the measured peak beside the analytic estimate
/// and its breakdown, the measured step time and the ETA of the whole run, and for common
/// rental cards (16, 24, 48, 80, 141 GB) whether the run fits as configured, with which plan,
/// or not at all (predicted from the line peak(b) = fixed + b x per_sample through the
/// probes). With `json`, one object: the plan event's fields plus "breakdown", "cards",
/// "step_seconds", "eta_seconds". Returns the exit code; throws ConfigError when nothing
/// fits this device.
int plan_command(const RunConfig& config, const std::string& device, int64_t memory_limit,
                 bool json, const Registry& registry, std::ostream& out);

}  // namespace gpurun

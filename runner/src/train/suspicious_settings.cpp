#include "train/suspicious_settings.h"

#include <spdlog/spdlog.h>

#include "memory/meter.h"
#include "train/run_setup.h"
#include "util/units.h"

namespace gpurun {

void warn_about_suspicious_settings(const RunConfig& config, const Session& session,
                                    int64_t memory_limit) {
  const int64_t samples = session.data.train ? session.data.train->size() : 0;
  if (samples > 0 && config.train.batch_size > samples)
    spdlog::warn(
        "train.batch_size {} is larger than the training set ({} samples): every epoch "
        "is a single optimizer step of {} samples",
        config.train.batch_size, samples, samples);

  const int64_t limit = memory_limit_bytes(config, memory_limit);
  const MemoryMeter& meter = *session.meter;
  if (limit > meter.device_bytes()) {
    const std::string what = memory_limit > 0 ? "--memory-limit " + format_bytes(limit)
                                              : "memory.capacity " + config.memory.capacity;
    spdlog::warn("{} is above the memory of {} ({}): {}", what, meter.device_name(),
                 format_bytes(meter.device_bytes()),
                 meter.capacity_bytes() > meter.device_bytes()
                     ? "the plan counts on memory the machine does not have and may choose "
                       "batches that do not fit"
                     : "the device's own memory is the limit");
  }
}

}  // namespace gpurun

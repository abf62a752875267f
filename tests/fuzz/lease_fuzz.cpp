// lease.json as every run reads it before it takes a checkpoint directory (lease.h): the
// parse, then the staleness rules and the description of the holder that a wait or a takeover
// logs. Input: the bytes of DIR/lease.json.
#include <chrono>

#include "checkpoint/storage/lease_holder.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = gpurun::fuzz::scratch_dir();
  gpurun::fuzz::write_file(dir + "/lease.json", data, size);
  gpurun::fuzz::expect_gpurun_errors([&] {
    const std::optional<gpurun::LeaseHolder> holder = gpurun::read_lease(dir);
    if (!holder) return;  // absent or unparsable: taken at once, as documented
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    (void)gpurun::lease_is_stale(*holder, /*fallback_timeout_seconds=*/60, now);
    (void)gpurun::describe_lease_holder(*holder, now);
  });
  return 0;
}

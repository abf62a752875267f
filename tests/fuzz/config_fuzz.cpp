// run.yaml and --set KEY=VALUE as `gpurun run` reads them (config.h): parse_config() of the
// YAML text with the overrides on top, then what a run does with the result (the resolved
// block it prints, the JSON a manifest stores and a resume reads back, the config hash).
// Input: the YAML text, then each override after a NUL byte ("yaml\0train.epochs=3\0...").
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "gpurun/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t end_of_yaml = input.find('\0');
  const std::string yaml = input.substr(0, end_of_yaml);
  std::vector<std::string> overrides;
  for (size_t at = end_of_yaml; at != std::string::npos && at < input.size();) {
    const size_t next = input.find('\0', at + 1);
    overrides.push_back(input.substr(at + 1, next == std::string::npos ? next : next - at - 1));
    at = next;
  }
  gpurun::fuzz::expect_gpurun_errors([&] {
    const gpurun::RunConfig config = gpurun::parse_config(yaml, "run.yaml", overrides);
    (void)gpurun::format_resolved(config);
    const gpurun::RunConfig back = gpurun::config_from_json(gpurun::config_to_json(config));
    if (gpurun::config_hash(back) != gpurun::config_hash(config)) {
      std::fprintf(stderr, "FINDING: the config does not survive its manifest JSON: %s\n",
                   gpurun::changed_training_keys(config, back).front().c_str());
      std::abort();
    }
  });
  return 0;
}

// QUEUE.yaml as `gpurun queue` reads it before any run starts (queue/queue_file.h). Input: the
// bytes of the queue file, whose relative configs resolve in a scratch directory that holds
// run.yaml. The one documented answer to bad input is ConfigError (exit 2): any other
// exception, gpurun's own included, is a finding. A queue that parses must keep the
// contract the scheduler relies on: at least one run, unique names that are file names,
// configs that exist, every set entry KEY=VALUE.
#include <filesystem>
#include <set>

#include "fuzz_util.h"
#include "queue/queue_file.h"

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "queue_fuzz: a parsed queue breaks its contract: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = gpurun::fuzz::scratch_dir();
  static const bool made = [&] {
    gpurun::fuzz::write_file(dir + "/run.yaml", std::string("train: {epochs: 1}\n"));
    return true;
  }();
  (void)made;
  const std::string text(reinterpret_cast<const char*>(data), size);
  gpurun::QueueFile queue;
  try {
    queue = gpurun::parse_queue_text(text, "q.yaml", dir, /*check_files=*/true);
  } catch (const gpurun::ConfigError& e) {
    gpurun::fuzz::report_rejected(e);
    return 0;
  } catch (const std::exception& e) {
    gpurun::fuzz::report_escaped(e);
  }
  if (queue.runs.empty()) broken("no runs");
  std::set<std::string> names;
  for (const gpurun::QueueRun& r : queue.runs) {
    if (r.name.empty() || r.name[0] == '.' || r.name.find('/') != std::string::npos)
      broken("name \"" + r.name + "\"");
    if (!names.insert(r.name).second) broken("two runs named " + r.name);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(r.config_path, ec)) broken("config " + r.config_path);
    for (const std::string& s : r.sets)
      if (s.find('=') == std::string::npos || s[0] == '=') broken("set " + s);
  }
  return 0;
}

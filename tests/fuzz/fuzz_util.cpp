#include "fuzz_util.h"

#include <cxxabi.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <typeinfo>

#include <spdlog/spdlog.h>

namespace gpurun::fuzz {
namespace {

/// The directory, removed when the process exits (a static's destructor: an atexit() handler
/// registered while the static is built would run after it is destroyed).
struct ScratchDir {
  std::string path;
  ScratchDir() {
    // /proc/self/exe names the target whatever path it was started by.
    const std::string target = std::filesystem::read_symlink("/proc/self/exe").filename().string();
    path = "/tmp/gpurun-fuzz-" + target + "-" + std::to_string(::getpid());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
    // Parsers warn about what they skip (a damaged checkpoint, a stale lease): millions of
    // inputs would drown libFuzzer's own output.
    spdlog::set_level(spdlog::level::off);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

const std::string& scratch_dir() {
  static const ScratchDir dir;
  return dir.path;
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

void report_rejected(const Error& e) {
  static const bool verbose = [] {
    const char* v = std::getenv("GPURUN_FUZZ_VERBOSE");
    return v && std::string(v) == "1";
  }();
  if (verbose) std::fprintf(stderr, "rejected: %s\n", e.what());
}

void report_escaped(const std::exception& e) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status), std::free);
  std::fprintf(stderr, "FINDING: %s escaped gpurun's parser instead of a gpurun::Error: %s\n",
               status == 0 ? name.get() : typeid(e).name(), e.what());
  std::abort();
}

}  // namespace gpurun::fuzz

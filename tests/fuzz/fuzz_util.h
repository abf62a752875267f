// What the fuzz targets share: a scratch directory for parsers that read files, and the rule
// that tells a documented rejection from a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "gpurun/errors.h"

namespace gpurun::fuzz {

/// This process's scratch directory (/tmp/gpurun-fuzz-<target>-<pid>), created by the first
/// call, removed at exit. One fixed place per process: inputs are written over each other, so
/// a run of millions of inputs leaves no files behind.
const std::string& scratch_dir();

/// Writes `size` bytes to `path`, replacing it; aborts when it cannot (the harness, not the
/// parser, failed).
void write_file(const std::string& path, const uint8_t* data, size_t size);
inline void write_file(const std::string& path, const std::string& bytes) {
  write_file(path, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

/// Aborts with the exception's type and message, which libFuzzer then reports as a crash.
[[noreturn]] void report_escaped(const std::exception& e);

/// With GPURUN_FUZZ_VERBOSE=1 in the environment, prints `e`'s message (to read what an input
/// is told: `GPURUN_FUZZ_VERBOSE=1 build/tests/fuzz-build/pickle_fuzz INPUT`).
void report_rejected(const Error& e);

/// Runs `parse`. gpurun::Error (ConfigError, ResumeError, IoError, ...) is the documented
/// answer to bad input and returns normally. Any other exception escaping gpurun's parser (a
/// std::out_of_range, a c10::Error, a YAML::Exception) is a finding: the user would see a
/// message that names neither the file nor what is wrong, and it would take the wrong exit code.
template <typename Parse>
void expect_gpurun_errors(Parse&& parse) {
  try {
    parse();
  } catch (const Error& e) {
    report_rejected(e);
  } catch (const std::exception& e) {
    report_escaped(e);
  }
}

}  // namespace gpurun::fuzz

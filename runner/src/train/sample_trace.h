// Test-only tracing of the samples each optimizer step consumed (GPURUN_TRACE_SAMPLES).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "util/fs.h"

namespace gpurun {

/// Test-only: GPURUN_TRACE_SAMPLES=FILE appends, per optimizer step, "STEP EPOCH i i i ...",
/// STEP being the 0-based global step, and the sample indices the step consumed on this rank
/// (rank R > 0 writes FILE.rankR), used to prove that resume neither repeats nor skips.
class SampleTrace {
 public:
  explicit SampleTrace(int rank) {
    if (const char* path = std::getenv("GPURUN_TRACE_SAMPLES"))
      path_ = rank == 0 ? path : std::string(path) + ".rank" + std::to_string(rank);
  }
  void record(int64_t step, int64_t epoch, const at::Tensor& indices) {
    if (path_.empty()) return;
    std::string line = std::to_string(step) + " " + std::to_string(epoch);
    const int64_t* p = indices.data_ptr<int64_t>();
    for (int64_t i = 0; i < indices.numel(); ++i) line += " " + std::to_string(p[i]);
    fs::append_line(path_, line);
  }

 private:
  std::string path_;
};

}  // namespace gpurun

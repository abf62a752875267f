// Host memory of a checkpoint save above its capture buffers: the state of
// scripts/bench/checkpoint.sh (MLP 784-4096-4096-4096-10 with Adam after one step, about
// 420 MiB), copied into host buffers as a save's stall does (HostStateCopy::copy), then built
// and written by the background writer (CheckpointWriter, as the trainer hands it a save) into
// DIR. The peak resident memory of the process during the build and the write (VmHWM, reset to
// the current resident size through /proc/self/clear_refs just before) minus the resident
// memory before them (VmRSS: the model, the optimizer and the copy) is what the save itself
// holds: images of files, a gathering buffer, the archive writers' tables. The page cache the
// write fills is the kernel's, not the process's. Median of `saves` saves.
//
// With --in-memory, each file is built into memory first (CheckpointSnapshot::materialize()) and
// then written, as saves were before they were streamed: the size of what streaming saves.
//
// Usage: gpurun_bench_checkpoint_memory DIR [SAVES=3] [--in-memory]
//   prints "host_bytes_above_buffers N", "copied_bytes N", "file_bytes N", "seconds S"
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/async_writer.h"
#include "checkpoint/format/state_copy.h"
#include "checkpoint/format/train_state.h"
#include "proc_status.h"

namespace {

using gpurun::bench::status_bytes;

template <class T>
T median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [SAVES=3]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int saves = argc > 2 ? std::atoi(argv[2]) : 3;
  const bool in_memory = argc > 3 && std::string(argv[3]) == "--in-memory";
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(784, 4096), torch::nn::ReLU(),
                              torch::nn::Linear(4096, 4096), torch::nn::ReLU(),
                              torch::nn::Linear(4096, 4096), torch::nn::ReLU(),
                              torch::nn::Linear(4096, 10));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(5e-4));
  model->forward(torch::randn({8, 784})).square().sum().backward();
  optimizer.step();

  gpurun::CheckpointStore store(dir, 1);
  gpurun::CheckpointWriter writer(store, /*async=*/true);
  gpurun::HostStateCopy copy;
  copy.keep_buffers(true);  // the buffers stay resident from save to save, as a kept copy does
  std::vector<long long> above;
  std::vector<double> seconds;
  long long file_bytes = 0;
  for (int i = 1; i <= saves; ++i) {
    copy.copy(*model, optimizer, gpurun::trainer_rng_states(*model));
    const long long before = status_bytes("VmRSS");
    std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS (Linux >= 4.0)
    gpurun::CheckpointSnapshot snapshot;
    snapshot.meta.global_step = i;
    writer.submit(std::move(snapshot), [&copy, in_memory](gpurun::CheckpointSnapshot& s) {
      copy.build(s);
      if (in_memory) s.materialize();
    });
    writer.wait();
    above.push_back(status_bytes("VmHWM") - before);
    for (const gpurun::WriteOutcome& o : writer.finished()) {
      if (!o.result) {
        std::fprintf(stderr, "save failed: %s\n", o.error.c_str());
        return 1;
      }
      seconds.push_back(o.build_seconds + o.result->write_seconds);
      file_bytes = o.result->bytes;
    }
  }
  std::printf("host_bytes_above_buffers %lld\n", median(above));
  std::printf("copied_bytes %lld\n", static_cast<long long>(copy.copied_bytes()));
  std::printf("file_bytes %lld\n", file_bytes);
  std::printf("seconds %.3f\n", median(seconds));
  return 0;
}

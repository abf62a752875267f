// The tokens data set's batches alone, no model: batches/s of Dataset::get_batch with random
// windows, as a training epoch asks for them (scripts/bench/tokens.sh compares it with
// nanoGPT's numpy memmap get_batch).
// Usage: gpurun_bench_tokens FILE BATCH CONTEXT BATCHES   (FILE: raw uint16 tokens)
// Prints one JSON object: {"batches_per_second": ..., "batches": ..., ...}.
#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "data/builtin_datasets.h"
#include "gpurun/dataset.h"
#include "gpurun/registry.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s FILE BATCH CONTEXT BATCHES\n", argv[0]);
    return 2;
  }
  at::set_num_threads(1);
  spdlog::set_level(spdlog::level::warn);  // stdout carries the JSON alone
  gpurun::Registry registry;
  gpurun::register_builtin_datasets(registry);
  gpurun::DataConfig c;
  c.name = "tokens";
  c.path = argv[1];
  c.eval_path = argv[1];
  c.vocab_size = 65536;  // every uint16 id
  c.context = std::atoll(argv[3]);
  const int64_t batch = std::atoll(argv[2]), batches = std::atoll(argv[4]);
  const gpurun::DatasetSplits splits = registry.make_dataset(c);
  const gpurun::Dataset& data = *splits.train;
  int64_t checksum = 0;
  auto run = [&](int64_t first, int64_t count) {
    for (int64_t b = first; b < first + count; ++b) {
      const at::Tensor positions = at::arange(b * batch, (b + 1) * batch, at::kLong);
      const gpurun::Batch x = data.get_batch(positions, {1, 0, positions});
      checksum += x.inputs.data_ptr<int64_t>()[0] + x.targets.data_ptr<int64_t>()[0];
    }
  };
  run(0, batches / 10 + 1);  // warm-up: the pages a first pass faults in
  const auto start = std::chrono::steady_clock::now();
  run(batches, batches);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "{\"batches_per_second\": %.3f, \"batches\": %lld, \"batch\": %lld, \"context\": %lld, "
      "\"seconds\": %.6f, \"checksum\": %lld}\n",
      static_cast<double>(batches) / seconds, static_cast<long long>(batches),
      static_cast<long long>(batch), static_cast<long long>(c.context), seconds,
      static_cast<long long>(checksum));
  return 0;
}

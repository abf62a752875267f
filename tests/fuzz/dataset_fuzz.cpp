// The idx, csv and text datasets (plugins/) as a run loads them through the registry, and one
// batch of each split. Input: one byte that picks the reader and its settings, then the file:
//   byte % 3 == 0: idx; (byte / 3) % 4 picks which of the four IDX files the rest becomes
//                  (train images, train labels, eval images, eval labels); the other three are
//                  small valid ones;
//   byte % 3 == 1: csv; bits of byte / 3 pick data.header, data.label and data.delimiter;
//   byte % 3 == 2: text; data.context = 1 + (byte / 3) % 8.
#include <filesystem>

#include <ATen/ops/arange.h>

#include "data/builtin_datasets.h"
#include "fuzz_util.h"
#include "gpurun/registry.h"

namespace {

// An IDX file of unsigned bytes: magic 0x00000800 + dims, big-endian sizes, then the data.
std::string idx_file(const std::vector<uint32_t>& sizes) {
  std::string out = {0, 0, 8, static_cast<char>(sizes.size())};
  size_t items = 1;
  for (uint32_t s : sizes) {
    for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((s >> shift) & 0xff);
    items *= s;
  }
  for (size_t i = 0; i < items; ++i) out += static_cast<char>(i % 10);
  return out;
}

void load_one_batch(const gpurun::Registry& registry, const gpurun::DataConfig& config) {
  const gpurun::DatasetSplits splits = registry.make_dataset(config);
  for (const auto& split : {splits.train, splits.eval}) {
    const int64_t n = std::min<int64_t>(split->size(), 4);
    if (n > 0) (void)split->get(at::arange(n, at::kLong));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const gpurun::Registry registry = [] {
    gpurun::Registry r;
    gpurun::register_builtin_datasets(r);
    return r;
  }();
  if (size == 0) return 0;
  const std::string& dir = gpurun::fuzz::scratch_dir();
  const unsigned choice = data[0] / 3;
  gpurun::DataConfig config;
  switch (data[0] % 3) {
    case 0: {
      static const char* const kFiles[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
      const std::string idx = dir + "/idx";
      std::filesystem::create_directories(idx);
      for (int k = 0; k < 4; ++k)
        gpurun::fuzz::write_file(idx + "/" + kFiles[k],
                                 k % 2 == 0 ? idx_file({3, 2, 2}) : idx_file({3}));
      gpurun::fuzz::write_file(idx + "/" + kFiles[choice % 4], data + 1, size - 1);
      config.name = "idx";
      config.path = idx;
      break;
    }
    case 1:
      config.name = "csv";
      config.path = dir + "/data.csv";
      config.header = (choice & 1) != 0;
      config.label = (choice & 2) != 0 ? "label" : ((choice & 4) != 0 ? "0" : "-1");
      config.delimiter = (choice & 8) != 0 ? "tab" : ",";
      config.eval_fraction = 0.5;
      gpurun::fuzz::write_file(config.path, data + 1, size - 1);
      break;
    default:
      config.name = "text";
      config.path = dir + "/data.txt";
      config.context = 1 + choice % 8;
      config.eval_fraction = 0.25;
      gpurun::fuzz::write_file(config.path, data + 1, size - 1);
      break;
  }
  gpurun::fuzz::expect_gpurun_errors([&] { load_one_batch(registry, config); });
  return 0;
}

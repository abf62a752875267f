// The `idx` dataset: MNIST-family IDX files (http://yann.lecun.com/exdb/mnist/, "FILE FORMATS"),
// gzip-compressed or plain, as shipped by Debian's dataset-fashion-mnist.
#include <zlib.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/narrow.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <vector>

#include "data/builtin_datasets.h"
#include "gpurun/errors.h"
#include "gpurun/registry.h"

namespace gpurun {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

/// The file `dir/name`, or `dir/name.gz` when only that exists.
std::string locate(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {dir + "/" + name, dir + "/" + name + ".gz"})
    if (std::filesystem::exists(candidate)) return candidate;
  throw ConfigError("data.path: no " + name + "[.gz] in " + dir +
                    " (Debian: apt-get install dataset-fashion-mnist)");
}

/// Reads one IDX file of unsigned bytes: magic 0x0000 08 D (D = number of dimensions), D
/// big-endian uint32 sizes, then the data. Returns a uint8 tensor of those sizes, limited to
/// the first `limit` items when limit > 0. Throws ConfigError naming the file when it is not
/// such a file, holds no items, or holds fewer bytes than its sizes say.
at::Tensor read_idx(const std::string& path, int expected_dims, int64_t limit) {
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) throw ConfigError("data.path: cannot open " + path + ": " + std::strerror(errno));
  // Bytes up to `bytes`, fewer at the end of the file; a read error throws.
  auto read_some = [&](void* buf, size_t bytes) {
    size_t done = 0;
    while (done < bytes) {
      int n = gzread(f.get(), static_cast<char*>(buf) + done,
                     static_cast<unsigned>(std::min<size_t>(bytes - done, 1u << 30)));
      if (n < 0) throw ConfigError("data.path: cannot read " + path + " (corrupt gzip?)");
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  };
  auto read_u32 = [&]() {
    unsigned char b[4];
    if (read_some(b, 4) < 4)
      throw ConfigError("data.path: " + path + " is truncated or not a valid IDX file");
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  };
  uint32_t magic = read_u32();
  if ((magic >> 8) != 0x08 || static_cast<int>(magic & 0xff) != expected_dims)
    throw ConfigError("data.path: " + path + " is not an IDX file of " +
                      std::to_string(expected_dims) + "-dimensional unsigned bytes (magic 0x" +
                      [&] {
                        char s[9];
                        std::snprintf(s, sizeof s, "%08x", magic);
                        return std::string(s);
                      }() +
                      ")");
  std::vector<int64_t> sizes;
  for (int d = 0; d < expected_dims; ++d) sizes.push_back(read_u32());
  std::string shape;
  for (int64_t s : sizes) shape += (shape.empty() ? "" : " x ") + std::to_string(s);
  if (limit > 0 && limit < sizes[0]) sizes[0] = limit;
  // The sizes are the file's word, not yet its bytes: a corrupt header may promise terabytes,
  // so the data is read as it comes, never allocated from the header alone.
  uint64_t total = 1;
  for (int64_t s : sizes) {
    if (s == 0) throw ConfigError("data.path: " + path + " holds no items (sizes " + shape + ")");
    if (total > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(s))
      throw ConfigError("data.path: " + path + " is not a valid IDX file: sizes " + shape +
                        " are more bytes than any file holds");
    total *= static_cast<uint64_t>(s);
  }
  auto data = std::make_unique<std::vector<uint8_t>>();
  constexpr size_t kChunk = size_t{1} << 24;
  while (data->size() < total) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, total - data->size()));
    const size_t old_size = data->size();
    data->resize(old_size + want);
    const size_t got = read_some(data->data() + old_size, want);
    data->resize(old_size + got);
    if (got < want) break;
  }
  if (data->size() < total)
    throw ConfigError(
        "data.path: " + path + " is truncated: its header says sizes " + shape +
        (limit > 0 ? " (the first " + std::to_string(sizes[0]) + " items read)" : "") + ", " +
        std::to_string(total) + " bytes, but it ends " + std::to_string(data->size()) +
        " bytes after the header");
  std::vector<uint8_t>* owned = data.release();
  return at::from_blob(
      owned->data(), sizes, [owned](void*) { delete owned; }, at::kByte);
}

DatasetSplits load_idx(const DataConfig& c) {
  if (!std::filesystem::is_directory(c.path))
    throw ConfigError(
        "data.path: " + c.path + " is not a directory" +
        (c.path == DataConfig{}.path ? " (apt-get install dataset-fashion-mnist)" : ""));
  at::Tensor train_x = read_idx(locate(c.path, "train-images-idx3-ubyte"), 3, c.train_samples);
  at::Tensor train_y = read_idx(locate(c.path, "train-labels-idx1-ubyte"), 1, c.train_samples);
  at::Tensor eval_x = read_idx(locate(c.path, "t10k-images-idx3-ubyte"), 3, c.eval_samples);
  at::Tensor eval_y = read_idx(locate(c.path, "t10k-labels-idx1-ubyte"), 1, c.eval_samples);
  if (train_x.size(0) != train_y.size(0) || eval_x.size(0) != eval_y.size(0))
    throw ConfigError("data.path: image and label files in " + c.path + " differ in length");
  if (c.train_samples > train_x.size(0) || c.eval_samples > eval_x.size(0))
    throw ConfigError("data.train_samples/eval_samples: asked for " +
                      std::to_string(c.train_samples) + "/" + std::to_string(c.eval_samples) +
                      " samples; " + c.path + " has " + std::to_string(train_x.size(0)) + "/" +
                      std::to_string(eval_x.size(0)));
  // Pixels are kept as uint8 (47 MB for Fashion-MNIST) and normalised per batch with the
  // training split's own mean and standard deviation.
  at::Tensor scaled = train_x.to(at::kFloat).div_(255);
  double mean = scaled.mean().item<double>();
  double std = scaled.std().item<double>();
  auto transform = [mean, std](const at::Tensor& x) {
    return x.to(at::kFloat).div_(255).sub_(mean).div_(std).unsqueeze_(1);
  };
  DatasetSplits splits;
  splits.train = std::make_shared<TensorDataset>(train_x, train_y.to(at::kLong), transform);
  splits.eval = std::make_shared<TensorDataset>(eval_x, eval_y.to(at::kLong), transform);
  splits.input_shape = {1, train_x.size(1), train_x.size(2)};
  splits.num_classes = std::max(train_y.max().item<int64_t>(), eval_y.max().item<int64_t>()) + 1;
  return splits;
}

}  // namespace

void register_idx_dataset(Registry& registry) { registry.add_dataset("idx", load_idx); }

}  // namespace gpurun

// The image_folder data set alone (decode, augment, collate; no model), for
// scripts/bench/image_folder.sh.
//
//   gpurun_bench_image_folder make DIR COUNT
//       writes COUNT JPEGs of 400x300 into DIR/<class>/, made from Fashion-MNIST's training
//       images: upscaled (bilinear), tinted per class, with seeded noise, quality 90
//   gpurun_bench_image_folder run DIR THREADS SAMPLES [IMAGE_SIZE]
//       one training epoch's batches of 64 (augment standard: RandomResizedCrop + flip, as the
//       torchvision side), THREADS threads each calling get_batch on every THREADS-th batch,
//       until SAMPLES samples; prints one JSON line with samples_per_second
#include <zlib.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randn.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "data/image_codec.h"
#include "data/image_folder.h"
#include "data/image_transforms.h"
#include "gpurun/config.h"

namespace {

using namespace gpurun;

std::vector<uint8_t> gunzip(const std::string& path) {
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), gzclose);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (int n; (n = gzread(f.get(), buf, sizeof buf)) > 0;) out.insert(out.end(), buf, buf + n);
  return out;
}

int make(const std::string& dir, int count) {
  const std::string fashion = "/usr/share/datasets/fashion-mnist";
  const std::vector<uint8_t> images = gunzip(fashion + "/train-images-idx3-ubyte.gz");
  const std::vector<uint8_t> labels = gunzip(fashion + "/train-labels-idx1-ubyte.gz");
  at::set_num_threads(1);
  // One field of noise, of which each image takes a window at its own offset: a photograph's
  // JPEG carries fine detail, and drawing fresh noise per image would cost more than the rest.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor field = at::randn({3, 300 + 64, 400 + 64}, gen).mul(8);
  for (int i = 0; i < count; ++i) {
    const int label = labels[8 + i % 60000];
    const at::Tensor gray = at::from_blob(
        const_cast<uint8_t*>(images.data()) + 16 + (i % 60000) * 784, {28, 28, 1}, at::kByte);
    at::Tensor big = resize_bilinear(gray, 300, 400).to(at::kFloat);  // [1, 300, 400]
    const float tint[3] = {1.0f - 0.05f * label, 0.6f + 0.04f * label, 0.8f};
    at::Tensor rgb = at::cat({big.mul(tint[0]), big.mul(tint[1]), big.mul(tint[2])}, 0);
    const at::Tensor noise = field.narrow(1, (i * 7) % 64, 300).narrow(2, (i * 13) % 64, 400);
    rgb = at::clamp(rgb.add(noise), 0, 255).to(at::kByte);
    const std::string cls = dir + "/class" + std::to_string(label);
    std::filesystem::create_directories(cls);
    const std::vector<uint8_t> jpeg = encode_jpeg(rgb.permute({1, 2, 0}).contiguous(), 90);
    std::ofstream(cls + "/" + std::to_string(i) + ".jpg", std::ios::binary)
        .write(reinterpret_cast<const char*>(jpeg.data()),
               static_cast<std::streamsize>(jpeg.size()));
  }
  return 0;
}

int run(const std::string& dir, int threads, int64_t samples, int64_t image_size) {
  at::set_num_threads(1);  // the threads below are the workers; no intra-op pool beside them
  DataConfig c;
  c.name = "image_folder";
  c.path = dir;
  c.eval_path = dir;
  c.image_size = image_size;
  const DatasetSplits splits = load_image_folder(c);
  const Dataset& d = *splits.train;
  const int64_t batch = 64, n = std::min<int64_t>(samples, d.size());
  const int64_t batches = (n + batch - 1) / batch;
  const at::Tensor order = epoch_permutation(d.size(), 0, 0);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int64_t b = t; b < batches; b += threads) {
        const int64_t len = std::min(batch, n - b * batch);
        BatchContext ctx;
        ctx.seed = 0;
        ctx.epoch = 0;
        ctx.positions = at::arange(b * batch, b * batch + len, at::kLong);
        d.get_batch(order.narrow(0, b * batch, len), ctx);
      }
    });
  for (auto& t : pool) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "{\"threads\": %d, \"samples\": %lld, \"seconds\": %.3f, \"samples_per_second\": %.1f}\n",
      threads, static_cast<long long>(n), seconds, n / seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 3 && args[0] == "make") return make(args[1], std::stoi(args[2]));
  if ((args.size() == 4 || args.size() == 5) && args[0] == "run")
    return run(args[1], std::stoi(args[2]), std::stoll(args[3]),
               args.size() == 5 ? std::stoll(args[4]) : 224);
  std::fprintf(stderr, "usage: %s make DIR COUNT | run DIR THREADS SAMPLES [IMAGE_SIZE]\n",
               argv[0]);
  return 2;
}

// The image_folder data set's samples and its factory (image_folder.h).
#include "data/image_folder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randperm.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "data/builtin_datasets.h"
#include "data/image_codec.h"
#include "data/image_transforms.h"
#include "gpurun/errors.h"
#include "gpurun/registry.h"

namespace gpurun {

ImageFolderDataset::ImageFolderDataset(std::vector<ImageFile> files, ImageTransformOptions options)
    : files_(std::move(files)), options_(std::move(options)) {
  TORCH_CHECK(options_.channels == 1 || options_.channels == 3,
              "ImageFolderDataset: channels must be 1 or 3, got ", options_.channels);
  TORCH_CHECK(static_cast<int64_t>(options_.mean.size()) == options_.channels &&
                  static_cast<int64_t>(options_.std.size()) == options_.channels,
              "ImageFolderDataset: mean and std need one value per channel");
}

Batch ImageFolderDataset::get(const at::Tensor& indices) const {
  return get_batch(indices, BatchContext{});
}

Batch ImageFolderDataset::get_batch(const at::Tensor& indices, const BatchContext& context) const {
  const at::Tensor idx = indices.to(at::kLong).contiguous();
  const int64_t b = idx.numel(), s = options_.image_size;
  const bool random = context.training() && options_.augment;
  at::Tensor positions;
  if (random) {
    TORCH_CHECK(context.positions.defined() && context.positions.numel() == b,
                "image_folder: a training batch needs one position per sample");
    positions = context.positions.to(at::kLong).contiguous();
  }
  at::Tensor inputs = at::empty({b, options_.channels, s, s}, at::kFloat);
  std::vector<int64_t> labels(static_cast<size_t>(b));
  const int64_t* ix = idx.data_ptr<int64_t>();
  for (int64_t k = 0; k < b; ++k) {
    TORCH_CHECK(ix[k] >= 0 && ix[k] < size(), "image_folder: index ", ix[k], " outside [0, ",
                size(), ")");
    uint64_t seed = 0;
    if (random) seed = sample_seed(context.seed, context.epoch, positions.data_ptr<int64_t>()[k]);
    labels[static_cast<size_t>(k)] = fill(ix[k], random ? &seed : nullptr, inputs[k]);
  }
  return {inputs, at::from_blob(labels.data(), {b}, at::kLong).clone()};
}

int64_t ImageFolderDataset::fill(int64_t index, const uint64_t* seed, at::Tensor out) const {
  const int64_t n = size();
  for (int64_t tries = 0; tries < n; ++tries) {
    const int64_t i = (index + tries) % n;
    const ImageFile& file = files_[static_cast<size_t>(i)];
    try {
      transform_into(file, seed, out);
      return file.label;
    } catch (const ConfigError& e) {
      if (!options_.skip_bad)
        throw ConfigError(options_.key + ": sample " + std::to_string(i) + ": " + e.what() +
                          "; set data.skip_bad: true to skip unreadable files");
      std::lock_guard<std::mutex> lock(bad_mutex_);
      if (bad_.insert(i).second)
        spdlog::warn("{}: skipping {} (data.skip_bad; {} unreadable so far): {}", options_.key,
                     file.path, bad_.size(), e.what());
    }
  }
  throw ConfigError(options_.key + ": no file of the split decodes (data.skip_bad skipped all " +
                    std::to_string(n) + ")");
}

void ImageFolderDataset::transform_into(const ImageFile& file, const uint64_t* seed,
                                        at::Tensor& out) const {
  const int64_t s = options_.image_size, c = options_.channels;
  const std::vector<uint8_t> bytes = read_file_bytes(file.path);
  const ImageSize full = image_size_of(bytes, file.path);
  at::Tensor chw;
  if (seed) {
    // RandomResizedCrop's box and the flip are drawn from the original size (the header's),
    // so that a JPEG can then be decoded at the smallest DCT scale that keeps the crop at
    // least S x S; the box is scaled with it.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(*seed);
    const CropBox box = random_resized_crop_box(full.width, full.height, gen);
    const bool flip = uniform01(gen) < 0.5;
    const auto need = [&](int64_t whole, int64_t part) {
      return static_cast<int64_t>(std::ceil(static_cast<double>(s) * whole / part));
    };
    const at::Tensor pixels = decode_image(bytes, c, file.path, need(full.width, box.width),
                                           need(full.height, box.height));
    const double sy = static_cast<double>(pixels.size(0)) / full.height;
    const double sx = static_cast<double>(pixels.size(1)) / full.width;
    const auto scaled = [](int64_t v, double f) {
      return static_cast<int64_t>(std::lround(v * f));
    };
    const int64_t top = std::min(scaled(box.top, sy), pixels.size(0) - 1);
    const int64_t left = std::min(scaled(box.left, sx), pixels.size(1) - 1);
    const int64_t h = std::clamp<int64_t>(scaled(box.height, sy), 1, pixels.size(0) - top);
    const int64_t w = std::clamp<int64_t>(scaled(box.width, sx), 1, pixels.size(1) - left);
    chw = resize_bilinear(pixels.narrow(0, top, h).narrow(1, left, w), s, s);
    if (flip) chw = at::flip(chw, {2});
  } else {
    const auto [rh, rw] = resized_size(full.width, full.height, s);
    const at::Tensor pixels = decode_image(bytes, c, file.path, rw, rh);
    const at::Tensor resized = resize_bilinear(pixels, rh, rw);
    const CropBox box = centre_crop_box(rw, rh, s);
    chw = resized.narrow(1, box.top, s).narrow(2, box.left, s);
  }
  normalize_into(chw, options_.mean, options_.std, out);
}

int64_t ImageFolderDataset::bad_files() const {
  std::lock_guard<std::mutex> lock(bad_mutex_);
  return static_cast<int64_t>(bad_.size());
}

namespace {

/// `n` files of `files` drawn by a generator seeded with (seed, salt), or all when n is 0.
std::vector<ImageFile> subset(std::vector<ImageFile> files, int64_t n, int64_t seed, uint64_t salt,
                              const char* key, const std::string& root) {
  if (n == 0) return files;
  if (n > static_cast<int64_t>(files.size()))
    throw ConfigError(std::string(key) + ": asked for " + std::to_string(n) + " samples; " + root +
                      " gives " + std::to_string(files.size()));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
      static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull ^ salt);
  const at::Tensor order =
      at::randperm(static_cast<int64_t>(files.size()), gen, at::TensorOptions().dtype(at::kLong));
  std::vector<ImageFile> out;
  for (int64_t k = 0; k < n; ++k) out.push_back(files[order[k].item<int64_t>()]);
  return out;
}

std::vector<double> per_channel(const std::vector<double>& given, double rgb[3], double gray,
                                int64_t channels) {
  if (given.size() == 1) return std::vector<double>(static_cast<size_t>(channels), given[0]);
  if (!given.empty()) return given;
  return channels == 3 ? std::vector<double>{rgb[0], rgb[1], rgb[2]} : std::vector<double>{gray};
}

}  // namespace

DatasetSplits load_image_folder(const DataConfig& c) {
  ImageFolderScan train = scan_image_folder(c.path, "data.path", c.skip_bad);
  std::vector<ImageFile> train_files = std::move(train.files), eval_files;
  if (!c.eval_path.empty()) {
    ImageFolderScan eval = scan_image_folder(c.eval_path, "data.eval_path", c.skip_bad);
    if (eval.classes != train.classes) {
      std::string only_train, only_eval;
      for (const auto& name : train.classes)
        if (!std::binary_search(eval.classes.begin(), eval.classes.end(), name))
          only_train += (only_train.empty() ? "" : ", ") + name;
      for (const auto& name : eval.classes)
        if (!std::binary_search(train.classes.begin(), train.classes.end(), name))
          only_eval += (only_eval.empty() ? "" : ", ") + name;
      throw ConfigError("data.eval_path: the classes of " + c.eval_path + " differ from those of " +
                        c.path + (only_train.empty() ? "" : "; only in data.path: " + only_train) +
                        (only_eval.empty() ? "" : "; only in data.eval_path: " + only_eval));
    }
    eval_files = std::move(eval.files);
  } else {
    // A shuffle first (data.seed alone): the listing is sorted by class.
    const auto n = static_cast<int64_t>(train_files.size());
    const auto held = static_cast<int64_t>(std::llround(c.eval_fraction * n));
    if (held < 1 || held >= n)
      throw ConfigError("data.eval_fraction " + std::to_string(c.eval_fraction) + " of the " +
                        std::to_string(n) + " files of " + c.path +
                        " leaves no evaluation or no training files; change it or give "
                        "data.eval_path");
    std::vector<ImageFile> all = subset(std::move(train_files), n, c.seed, 0, "data.path", c.path);
    eval_files.assign(all.begin(), all.begin() + held);
    train_files.assign(all.begin() + held, all.end());
  }
  train_files =
      subset(std::move(train_files), c.train_samples, c.seed, 1, "data.train_samples", c.path);
  eval_files = subset(std::move(eval_files), c.eval_samples, c.seed, 2, "data.eval_samples",
                      c.eval_path.empty() ? c.path : c.eval_path);

  // ImageNet's statistics (torchvision's reference recipes) for RGB; 0.5 for gray, which maps
  // [0, 1] to [-1, 1] without assuming anything about the data.
  double imagenet_mean[3] = {0.485, 0.456, 0.406}, imagenet_std[3] = {0.229, 0.224, 0.225};
  ImageTransformOptions options;
  options.image_size = c.image_size;
  options.channels = c.channels;
  options.augment = c.augment == "standard";
  options.mean = per_channel(c.mean, imagenet_mean, 0.5, c.channels);
  options.std = per_channel(c.std, imagenet_std, 0.5, c.channels);
  options.skip_bad = c.skip_bad;
  ImageTransformOptions eval_options = options;
  eval_options.augment = false;
  eval_options.key = c.eval_path.empty() ? "data.path" : "data.eval_path";
  spdlog::info(
      "image_folder: {} classes, {} training and {} evaluation files{}, samples [{}, {}, {}]",
      train.classes.size(), train_files.size(), eval_files.size(),
      train.skipped.empty() ? "" : " (" + std::to_string(train.skipped.size()) + " skipped)",
      c.channels, c.image_size, c.image_size);

  DatasetSplits splits;
  splits.train = std::make_shared<ImageFolderDataset>(std::move(train_files), options);
  splits.eval = std::make_shared<ImageFolderDataset>(std::move(eval_files), eval_options);
  splits.input_shape = {c.channels, c.image_size, c.image_size};
  splits.num_classes = static_cast<int64_t>(train.classes.size());
  splits.class_names = train.classes;
  return splits;
}

void register_image_folder_dataset(Registry& registry) {
  registry.add_dataset("image_folder", load_image_folder);
}

}  // namespace gpurun

// Tests of the image_folder data set: its decoders (data/image_codec.h), its transforms
// (data/image_transforms.h) and the data set itself, on files the tests write with the same
// libraries.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/tensor.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"

#include "data/image_codec.h"
#include "data/image_folder.h"
#include "data/image_transforms.h"
#include "gpurun/config.h"
#include "gpurun/errors.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" is not in:\n" << text;
}

/// uint8 [h, w, c] of one colour.
at::Tensor solid(int64_t h, int64_t w, std::vector<int64_t> colour) {
  at::Tensor t = at::empty({h, w, static_cast<int64_t>(colour.size())}, at::kByte);
  for (size_t k = 0; k < colour.size(); ++k) t.select(2, static_cast<int64_t>(k)).fill_(colour[k]);
  return t;
}

/// uint8 [h, w, c] of seeded noise: every crop of it differs.
at::Tensor noise(int64_t h, int64_t w, int64_t c, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(0, 256, {h, w, c}, gen, at::TensorOptions().dtype(at::kByte));
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  stdfs::create_directories(stdfs::path(path).parent_path());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ImageCodec, PngRoundTripsExactlyInRgbAndGray) {
  const at::Tensor rgb = noise(30, 40, 3, 1), gray = noise(30, 40, 1, 2);
  EXPECT_TRUE(at::equal(decode_image(encode_png(rgb), 3, "rgb.png"), rgb));
  EXPECT_TRUE(at::equal(decode_image(encode_png(gray), 1, "gray.png"), gray));
}

TEST(ImageCodec, JpegDecodesKnownPixelsAndIsFoundByItsBytesNotItsName) {
  const std::vector<uint8_t> jpeg = encode_jpeg(solid(32, 48, {200, 100, 50}), 95);
  EXPECT_EQ(sniff_image_format(jpeg.data(), jpeg.size()), ImageFormat::kJpeg);
  const at::Tensor back = decode_image(jpeg, 3, "named.png");
  ASSERT_EQ(back.sizes(), (at::IntArrayRef{32, 48, 3}));
  const at::Tensor diff = back.to(at::kInt).sub(solid(32, 48, {200, 100, 50}).to(at::kInt)).abs();
  EXPECT_LE(diff.max().item<int>(), 3) << "a solid colour survives JPEG within a few levels";
}

TEST(ImageCodec, ConvertsColourToGrayAsPilAndGrayToRgbByRepeating) {
  // PIL's convert("L"): (19595 R + 38470 G + 7471 B + 2^15) >> 16.
  const int64_t luma = (19595 * 200 + 38470 * 100 + 7471 * 50 + 32768) >> 16;
  const at::Tensor gray = decode_image(encode_png(solid(4, 5, {200, 100, 50})), 1, "c.png");
  EXPECT_TRUE(at::equal(gray, solid(4, 5, {luma})));
  const at::Tensor jpeg_gray =
      decode_image(encode_jpeg(solid(16, 16, {200, 100, 50}), 95), 1, "c.jpg");
  EXPECT_NEAR(jpeg_gray.to(at::kFloat).mean().item<double>(), static_cast<double>(luma), 2.0);
  const at::Tensor rgb = decode_image(encode_png(solid(4, 5, {77})), 3, "g.png");
  EXPECT_TRUE(at::equal(rgb, solid(4, 5, {77, 77, 77})));
}

TEST(ImageCodec, CorruptTruncatedAndForeignBytesAreErrorsNamingTheFile) {
  std::vector<uint8_t> png = encode_png(noise(20, 20, 3, 3));
  png.resize(png.size() / 2);
  EXPECT_TRUE(contains(error_of([&] { decode_image(png, 3, "/d/cat/half.png"); }),
                       "/d/cat/half.png: not a readable PNG file"));
  std::vector<uint8_t> jpeg = encode_jpeg(noise(64, 64, 3, 4));
  jpeg.resize(jpeg.size() / 2);
  EXPECT_TRUE(contains(error_of([&] { decode_image(jpeg, 3, "/d/cat/half.jpg"); }),
                       "/d/cat/half.jpg: not a readable JPEG file"));
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
  EXPECT_TRUE(contains(error_of([&] { decode_image(text, 3, "/d/cat/notes.jpg"); }),
                       "/d/cat/notes.jpg: not a readable JPEG or PNG file"));
}

TEST(ImageTransforms, SizesFollowTorchvision) {
  EXPECT_EQ(resized_size(400, 300, 224), std::make_pair(int64_t{224}, int64_t{298}));
  EXPECT_EQ(resized_size(300, 400, 224), std::make_pair(int64_t{298}, int64_t{224}));
  EXPECT_EQ(centre_crop_box(298, 224, 224), (CropBox{0, 37, 224, 224}));
  // Every draw misses for a 100:1 strip: the fallback is the centre crop at ratio 4/3.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  EXPECT_EQ(random_resized_crop_box(1000, 10, gen), (CropBox{0, 493, 10, 13}));
}

TEST(ImageTransforms, RandomResizedCropStaysInsideAndRepeatsPerSeed) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    at::Generator a = at::make_generator<at::CPUGeneratorImpl>(seed);
    at::Generator b = at::make_generator<at::CPUGeneratorImpl>(seed);
    const CropBox box = random_resized_crop_box(400, 300, a);
    EXPECT_EQ(box, random_resized_crop_box(400, 300, b));
    EXPECT_GE(box.top, 0);
    EXPECT_GE(box.left, 0);
    EXPECT_LE(box.top + box.height, 300);
    EXPECT_LE(box.left + box.width, 400);
    EXPECT_GE(box.height * box.width, static_cast<int64_t>(0.08 * 400 * 300 * 0.9));
  }
}

class ImageFolder : public ::testing::Test {
 protected:
  /// root/<class>/<name>: `pixels` as PNG, or as JPEG when the name ends in .jpg.
  std::string put(const std::string& root, const std::string& cls, const std::string& name,
                  const at::Tensor& pixels) {
    const std::string path = tmp_ / (root + "/" + cls + "/" + name);
    write_bytes(path, name.size() > 4 && name.substr(name.size() - 4) == ".jpg"
                          ? encode_jpeg(pixels)
                          : encode_png(pixels));
    return path;
  }
  DataConfig config(const std::string& root) {
    DataConfig c;
    c.name = "image_folder";
    c.path = tmp_ / root;
    c.image_size = 16;
    c.eval_fraction = 0.25;
    return c;
  }
  test::TempDir tmp_{"images"};
};

TEST_F(ImageFolder, ClassesAreSortedFolderNamesAndEvalGivesNormalisedCentreCrops) {
  put("a", "shirt", "1.png", solid(20, 24, {255, 0, 51}));
  put("a", "bag", "1.png", solid(24, 20, {0, 255, 102}));
  put("a", "bag", "2.jpg", noise(40, 30, 3, 1));
  put("a", "shirt", "2.png", noise(20, 20, 3, 2));
  DataConfig c = config("a");
  c.eval_fraction = 0.5;
  const DatasetSplits splits = load_image_folder(c);
  EXPECT_EQ(splits.class_names, (std::vector<std::string>{"bag", "shirt"}));
  EXPECT_EQ(splits.num_classes, 2);
  EXPECT_EQ(splits.input_shape, (std::vector<int64_t>{3, 16, 16}));
  EXPECT_EQ(splits.train->size() + splits.eval->size(), 4);

  ImageTransformOptions o;
  o.image_size = 16;
  o.mean = {0.5, 0.5, 0.5};
  o.std = {0.25, 0.5, 1.0};
  ImageFolderDataset d({{tmp_ / "a/shirt/1.png", 1}, {tmp_ / "a/bag/1.png", 0}}, o);
  const Batch b = d.get(at::tensor({0, 1}, at::kLong));
  ASSERT_EQ(b.inputs.sizes(), (at::IntArrayRef{2, 3, 16, 16}));
  EXPECT_EQ(b.inputs.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(b.targets, at::tensor({1, 0}, at::kLong)));
  // A solid colour stays itself through resize and crop: (x / 255 - mean) / std.
  const at::Tensor want = at::tensor({(1.0f - 0.5f) / 0.25f, (0.0f - 0.5f) / 0.5f, 0.2f - 0.5f});
  EXPECT_TRUE(at::allclose(b.inputs[0].mean({1, 2}), want, 1e-5, 1e-5)) << b.inputs[0].mean({1, 2});
}

TEST_F(ImageFolder, TrainingDrawsDependOnSeedEpochAndPositionOnlyNotOnTheBatch) {
  for (int k = 0; k < 6; ++k)
    put("b", k % 2 ? "x" : "y", std::to_string(k) + (k % 3 ? ".png" : ".jpg"),
        noise(30 + k, 40, 3, static_cast<uint64_t>(k)));
  DataConfig c = config("b");
  c.eval_path = c.path;
  const DatasetSplits splits = load_image_folder(c);
  const Dataset& train = *splits.train;
  const auto batch = [&](std::vector<int64_t> idx, std::vector<int64_t> pos, int64_t epoch) {
    BatchContext ctx;
    ctx.seed = 3;
    ctx.epoch = epoch;
    ctx.positions = at::tensor(pos, at::kLong);
    return train.get_batch(at::tensor(idx, at::kLong), ctx).inputs;
  };
  const at::Tensor whole = batch({0, 1, 2, 3, 4, 5}, {10, 11, 12, 13, 14, 15}, 2);
  EXPECT_TRUE(at::equal(whole[3], batch({3}, {13}, 2)[0]));
  EXPECT_TRUE(at::equal(whole.narrow(0, 1, 2), batch({1, 2}, {11, 12}, 2)));
  EXPECT_TRUE(at::equal(whole, batch({0, 1, 2, 3, 4, 5}, {10, 11, 12, 13, 14, 15}, 2)));
  EXPECT_FALSE(at::equal(whole[3], batch({3}, {13}, 1)[0])) << "another epoch draws anew";
  EXPECT_FALSE(at::equal(whole[3], batch({3}, {14}, 2)[0])) << "another position draws anew";
  // Evaluation (and get) draws nothing: the same pixels every time.
  EXPECT_TRUE(at::equal(train.get(at::tensor({3}, at::kLong)).inputs,
                        splits.eval->get(at::tensor({3}, at::kLong)).inputs));
  // augment none: training batches are the evaluation transform.
  c.augment = "none";
  const DatasetSplits plain = load_image_folder(c);
  BatchContext ctx;
  ctx.epoch = 1;
  ctx.positions = at::tensor({0}, at::kLong);
  EXPECT_TRUE(at::equal(plain.train->get_batch(at::tensor({3}, at::kLong), ctx).inputs,
                        splits.eval->get(at::tensor({3}, at::kLong)).inputs));
}

TEST_F(ImageFolder, GrayChannelsAndDefaultsFollowTheConfig) {
  put("g", "a", "1.png", solid(16, 16, {255, 255, 255}));
  put("g", "b", "1.png", solid(16, 16, {0, 0, 0}));
  DataConfig c = config("g");
  c.eval_path = c.path;
  c.channels = 1;
  const DatasetSplits splits = load_image_folder(c);
  const Batch b = splits.eval->get(at::tensor({0, 1}, at::kLong));
  ASSERT_EQ(b.inputs.sizes(), (at::IntArrayRef{2, 1, 16, 16}));
  EXPECT_FLOAT_EQ(b.inputs[0].max().item<float>(), 1.0f);  // (1 - 0.5) / 0.5
  EXPECT_FLOAT_EQ(b.inputs[1].min().item<float>(), -1.0f);
}

TEST_F(ImageFolder, StartupChecksNameTheFolderOrFile) {
  EXPECT_TRUE(contains(error_of([&] { load_image_folder(config("missing")); }),
                       "data.path: " + tmp_ / "missing" + " does not exist"));
  stdfs::create_directories(tmp_ / "flat");
  write_bytes(tmp_ / "flat/1.png", encode_png(solid(2, 2, {1})));
  EXPECT_TRUE(
      contains(error_of([&] { load_image_folder(config("flat")); }), "holds no class folders"));
  put("e", "a", "1.png", solid(4, 4, {1}));
  stdfs::create_directories(tmp_ / "e/b");
  EXPECT_TRUE(contains(error_of([&] { load_image_folder(config("e")); }),
                       "class folder b of " + tmp_ / "e" + " holds no JPEG or PNG file"));
  put("t", "a", "1.png", solid(4, 4, {1}));
  put("t", "a", "2.png", solid(4, 4, {1}));
  put("t", "b", "1.png", solid(4, 4, {1}));
  write_bytes(tmp_ / "t/b/readme.jpg", {'h', 'i'});
  EXPECT_TRUE(contains(error_of([&] { load_image_folder(config("t")); }),
                       "data.path: " + tmp_ / "t/b/readme.jpg" + " is not a JPEG or PNG file"));
  DataConfig skip = config("t");
  skip.skip_bad = true;
  EXPECT_EQ(load_image_folder(skip).train->size() + load_image_folder(skip).eval->size(), 3);
  put("v", "a", "1.png", solid(4, 4, {1}));
  put("v", "c", "1.png", solid(4, 4, {1}));
  DataConfig other = config("t");
  other.skip_bad = true;
  other.eval_path = tmp_ / "v";
  EXPECT_TRUE(contains(error_of([&] { load_image_folder(other); }),
                       "only in data.path: b; only in data.eval_path: c"));
}

TEST_F(ImageFolder, CorruptContentIsAnErrorNamingTheFileOrSkippedAndCounted) {
  const std::string good = put("c", "a", "1.png", solid(8, 8, {10, 20, 30}));
  std::vector<uint8_t> half = encode_png(noise(8, 8, 3, 1));
  half.resize(half.size() / 2);
  const std::string bad = tmp_ / "c/b/2.png";
  write_bytes(bad, half);
  ImageTransformOptions o;
  o.image_size = 8;
  o.mean = {0, 0, 0};
  o.std = {1, 1, 1};
  ImageFolderDataset strict({{good, 0}, {bad, 1}}, o);
  EXPECT_TRUE(contains(error_of([&] { strict.get(at::tensor({1}, at::kLong)); }),
                       "data.path: sample 1: " + bad + ": not a readable PNG file"));
  o.skip_bad = true;
  ImageFolderDataset lenient({{good, 0}, {bad, 1}}, o);
  for (int k = 0; k < 3; ++k) {
    const Batch b = lenient.get(at::tensor({1, 0}, at::kLong));
    EXPECT_TRUE(at::equal(b.targets, at::tensor({0, 0}, at::kLong))) << "replaced by sample 0";
    EXPECT_TRUE(at::equal(b.inputs[0], b.inputs[1]));
  }
  EXPECT_EQ(lenient.bad_files(), 1) << "counted once per file";
}

TEST(ImageFolderConfig, KeysAreCheckedAndRoundTripThroughTheManifestJson) {
  const std::string base = "data: {name: image_folder, path: /x}\nmodel: {name: cnn}\n";
  const RunConfig c = parse_config(base, "run.yaml",
                                   {"data.mean=[0.5, 0.25, 0.125]", "data.std=[0.5]",
                                    "data.channels=3", "data.augment=none", "data.skip_bad=true"});
  EXPECT_EQ(c.data.mean, (std::vector<double>{0.5, 0.25, 0.125}));
  EXPECT_EQ(c.data.std, (std::vector<double>{0.5}));
  const RunConfig back = config_from_json(config_to_json(c));
  EXPECT_EQ(back.data.mean, c.data.mean);
  EXPECT_EQ(back.data.augment, "none");
  EXPECT_TRUE(back.data.skip_bad);
  EXPECT_EQ(config_hash(back), config_hash(c));
  const auto error = [&](const std::string& set) {
    return error_of([&] { parse_config(base, "run.yaml", {set}); });
  };
  EXPECT_TRUE(contains(error("data.channels=2"), "data.channels must be 1 (grayscale) or 3"));
  EXPECT_TRUE(contains(error("data.mean=[0.1, 0.2]"),
                       "data.mean must hold one value or one per channel (3), got 2"));
  EXPECT_TRUE(contains(error("data.std=[0.5, 0]"), "data.std must be a list of numbers > 0"));
  EXPECT_TRUE(contains(error("data.augment=standrad"), "did you mean standard?"));
  EXPECT_TRUE(contains(error("data.mean=half"), "data.mean must be a list of numbers"));
}

}  // namespace
}  // namespace gpurun

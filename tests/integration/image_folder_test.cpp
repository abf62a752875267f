// data.name image_folder end to end with the real binary (issue 30, "Image folder" and "Bad
// input"): Fashion-MNIST written out as PNG files in one folder per class trains to the IDX
// path's accuracy, a SIGKILLed run resumes to the uninterrupted digest, and bad folders and
// files exit 2 naming what is wrong.
#include <zlib.h>

#include <ATen/ops/from_blob.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include <gtest/gtest.h>

#include "data/image_codec.h"
#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace stdfs = std::filesystem;

const char* const kFashion = "/usr/share/datasets/fashion-mnist";
// Class folders sort in label order, so that image_folder's class index is the IDX label.
const char* const kClasses[] = {"0_tshirt", "1_trouser", "2_pullover", "3_dress", "4_coat",
                                "5_sandal", "6_shirt",   "7_sneaker",  "8_bag",   "9_boot"};

/// The bytes of a gzip file.
std::vector<uint8_t> gunzip(const std::string& path) {
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), gzclose);
  EXPECT_TRUE(f) << path;
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (int n; f && (n = gzread(f.get(), buf, sizeof buf)) > 0;) out.insert(out.end(), buf, buf + n);
  return out;
}

/// The first `count` images of an IDX split written as root/<class>/<n>.png (28x28 gray).
void write_pngs(const std::string& split, const std::string& root, int count) {
  const std::vector<uint8_t> images =
      gunzip(std::string(kFashion) + "/" + split + "-images-idx3-ubyte.gz");
  const std::vector<uint8_t> labels =
      gunzip(std::string(kFashion) + "/" + split + "-labels-idx1-ubyte.gz");
  ASSERT_GE(labels.size(), 8u + count);
  for (const char* name : kClasses) stdfs::create_directories(root + "/" + name);
  for (int i = 0; i < count; ++i) {
    const at::Tensor pixels =
        at::from_blob(const_cast<uint8_t*>(images.data()) + 16 + i * 784, {28, 28, 1}, at::kByte);
    const std::vector<uint8_t> png = encode_png(pixels);
    std::ofstream(root + "/" + kClasses[labels[8 + i]] + "/" + std::to_string(i) + ".png",
                  std::ios::binary)
        .write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  }
}

/// One folder of Fashion-MNIST PNGs per test binary, written once.
class ImageFolderRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!stdfs::exists(std::string(kFashion) + "/train-labels-idx1-ubyte.gz")) return;
    data_ = new TempDir("fashion-png");
    write_pngs("train", data_->path() + "/train", kTrain);
    write_pngs("t10k", data_->path() + "/test", kEval);
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }
  void SetUp() override {
    if (!data_) GTEST_SKIP() << "no Fashion-MNIST (apt-get install dataset-fashion-mnist)";
  }
  /// The CNN of examples/fashion_mnist.yaml on the PNG folders; `extra` more YAML lines.
  std::string config(const std::string& extra = "") {
    return write_config(dir_,
                        "model: {name: cnn, channels: [32, 64], batch_norm: true, dropout: 0.25}\n"
                        "data: {name: image_folder, path: " +
                            data_->path() + "/train, eval_path: " + data_->path() +
                            "/test, image_size: 28, channels: 1, augment: none}\n"
                            "optim: {name: adam, lr: 0.002}\n"
                            "schedule: {name: cosine, warmup_steps: 100}\n"
                            "train: {epochs: 1, batch_size: 64, eval_batch_size: 500, seed: 1, "
                            "threads: 2}\n"
                            "log: {every_steps: 20}\n" +
                            extra);
  }
  static constexpr int kTrain = 60000, kEval = 2000;
  static TempDir* data_;
  TempDir dir_;
};
TempDir* ImageFolderRun::data_ = nullptr;

TEST_F(ImageFolderRun, FashionMnistPngsTrainToTheIdxPathsAccuracy) {
  const Result r = run_gpurun({config(), "--ckpt", dir_ / "ckpt"}, {}, 600);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto epochs = events(dir_ / "ckpt", "epoch");
  ASSERT_EQ(epochs.size(), 1u);
  EXPECT_GE(epochs.back()["eval_accuracy"].get<double>(), 0.90);
  const nlohmann::json manifest = inspect(dir_ / "ckpt");
  EXPECT_EQ(manifest["extra"]["class_names"],
            nlohmann::json(std::vector<std::string>(std::begin(kClasses), std::end(kClasses))));
  EXPECT_TRUE(contains(r.err, "image_folder: 10 classes, 60000 training and 2000 evaluation"))
      << r.err;
}

TEST_F(ImageFolderRun, SigkillAndResumeGiveTheUninterruptedDigest) {
  // Augmented (random crops and flips from each sample's seed), 3000 samples, a save every 8
  // steps.
  const std::string c = config("checkpoint: {every_steps: 8}\n");
  const std::vector<std::string> sets = {"data.augment=standard", "data.train_samples=3000",
                                         "data.eval_samples=500", "model.channels=[8, 16]"};
  const Result full = run_gpurun(with_sets({c, "--ckpt", dir_ / "full"}, sets));
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const std::string digest = inspect(dir_ / "full").value("model_digest", "");
  ASSERT_EQ(digest.size(), 16u);
  const int killed =
      sigkill_after_checkpoints(with_sets({c, "--ckpt", dir_ / "killed", "--resume"}, sets),
                                dir_ / "killed", dir_ / "killed-log", 2);
  EXPECT_EQ(killed, 2);
  EXPECT_EQ(inspect(dir_ / "killed").value("model_digest", ""), digest);
}

TEST_F(ImageFolderRun, DigestIsTheSameWithZeroOneAndFourWorkers) {
  // Augmented: each sample's crop and flip come from its place in the epoch, never from the
  // worker that decodes it.
  const std::string c = config();
  const std::vector<std::string> sets = {"data.augment=standard", "data.train_samples=1200",
                                         "data.eval_samples=300", "model.channels=[8, 16]"};
  std::string first;
  for (const char* workers : {"0", "1", "4"}) {
    const std::string ckpt = dir_ / (std::string("w") + workers);
    std::vector<std::string> args = with_sets({c, "--ckpt", ckpt}, sets);
    args.insert(args.end(), {"--set", std::string("data.workers=") + workers});
    const Result r = run_gpurun(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string digest = inspect(ckpt).value("model_digest", "");
    ASSERT_EQ(digest.size(), 16u);
    if (first.empty()) first = digest;
    EXPECT_EQ(digest, first) << "data.workers " << workers;
  }
}

/// A copy of a few classes of the PNGs, to spoil.
std::string small_folder(const std::string& from, const std::string& to) {
  for (const char* cls : {"0_tshirt", "1_trouser"}) {
    stdfs::create_directories(to + "/" + cls);
    int n = 0;
    for (const auto& e : stdfs::directory_iterator(from + "/" + cls)) {
      stdfs::copy_file(e.path(), to + "/" + cls + "/" + e.path().filename().string());
      if (++n == 40) break;
    }
  }
  return to;
}

// Issue 40, item 6: 40 images added to the folder between a stop and the resume (the held-out
// split and the epoch would move) stop the resume with exit 3 naming the folder's counts.
TEST_F(ImageFolderRun, ImagesAddedBeforeAResumeStopItWithExit3) {
  const std::string folder = dir_ / "folder", later = dir_ / "later";
  for (const char* cls : {"0_tshirt", "1_trouser"}) {
    stdfs::create_directories(folder + "/" + cls);
    stdfs::create_directories(later + "/" + cls);
    int n = 0;
    for (const auto& e : stdfs::directory_iterator(data_->path() + "/train/" + cls)) {
      // The first 80 of each class now, 20 more later.
      stdfs::copy_file(e.path(),
                       (n < 80 ? folder : later) + "/" + cls + "/" + e.path().filename().string());
      if (++n == 100) break;
    }
  }
  const std::string c = write_config(dir_,
                                     "model: {name: mlp, hidden: [16]}\n"
                                     "data: {name: image_folder, path: " +
                                         folder +
                                         ", image_size: 28, channels: 1, augment: none}\n"
                                         "train: {epochs: 2, batch_size: 16, threads: 1}\n",
                                     "added.yaml");
  const std::string ckpt = dir_ / "added";
  const Result stopped =
      run_gpurun({c, "--ckpt", ckpt}, {{"GPURUN_FAULT", "sigterm:after_step:3"}});
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  for (const char* cls : {"0_tshirt", "1_trouser"})
    for (const auto& e : stdfs::directory_iterator(later + "/" + cls))
      stdfs::copy_file(e.path(), folder + "/" + cls + "/" + e.path().filename().string());
  const Result refused = run_gpurun({c, "--ckpt", ckpt, "--resume"});
  EXPECT_EQ(refused.exit_code, 3) << refused.err;
  EXPECT_TRUE(contains(refused.err, "data.path " + folder + ": 200 files of ")) << refused.err;
  EXPECT_TRUE(contains(refused.err, "was 160 files of ")) << refused.err;
  EXPECT_TRUE(contains(refused.err, "training samples: 180, was 144")) << refused.err;
}

TEST_F(ImageFolderRun, BadFoldersAndFilesExitTwoNamingThemWithNothingUnderCkpt) {
  const std::string model = "model: {name: mlp, hidden: [16]}\ntrain: {threads: 1}\n";
  const auto run = [&](const std::string& name, const std::string& data) {
    const std::string c = write_config(dir_,
                                       model +
                                           "data: {name: image_folder, image_size: 28, "
                                           "channels: 1, " +
                                           data + "}\n",
                                       name + ".yaml");
    return run_gpurun({c, "--ckpt", dir_ / ("ckpt-" + name)});
  };
  const auto untouched = [&](const std::string& name) {
    return !stdfs::exists(dir_ / ("ckpt-" + name)) || stdfs::is_empty(dir_ / ("ckpt-" + name));
  };
  // A file that is no image, whatever its name.
  const std::string text = small_folder(data_->path() + "/train", dir_ / "text");
  std::ofstream(text + "/1_trouser/notes.png") << "not a picture\n";
  Result r = run("text", "path: " + text);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, text + "/1_trouser/notes.png is not a JPEG or PNG file")) << r.err;
  EXPECT_TRUE(untouched("text"));
  // A class folder without images.
  const std::string empty = small_folder(data_->path() + "/train", dir_ / "empty");
  stdfs::create_directories(empty + "/2_pullover");
  r = run("empty", "path: " + empty);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "class folder 2_pullover of " + empty + " holds no JPEG or PNG"))
      << r.err;
  EXPECT_TRUE(untouched("empty"));
  // Evaluation classes other than training's.
  const std::string more = small_folder(data_->path() + "/train", dir_ / "more");
  stdfs::create_directories(more + "/2_pullover");
  const stdfs::path pullover = *stdfs::directory_iterator(data_->path() + "/train/2_pullover");
  stdfs::copy_file(pullover, more + "/2_pullover/" + pullover.filename().string());
  r = run("classes", "path: " + text + ", eval_path: " + more + ", skip_bad: true");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "only in data.eval_path: 2_pullover")) << r.err;
  EXPECT_TRUE(untouched("classes"));
  // No folder at all.
  r = run("missing", "path: " + dir_ / "nowhere");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "data.path: " + dir_ / "nowhere" + " does not exist")) << r.err;
  EXPECT_TRUE(untouched("missing"));
  // A PNG cut short: found when decoded, named with its sample; skipped under skip_bad.
  const std::string cut = small_folder(data_->path() + "/train", dir_ / "cut");
  const std::string victim = stdfs::directory_iterator(cut + "/0_tshirt")->path().string();
  stdfs::resize_file(victim, stdfs::file_size(victim) / 2);
  r = run("cut", "path: " + cut);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, victim + ": not a readable PNG file")) << r.err;
  r = run("cut-skipped", "path: " + cut + ", skip_bad: true");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "skipping " + victim)) << r.err;
  EXPECT_EQ(count_of(r.err, "skipping " + victim), 1u) << "logged once per file\n" << r.err;
}

}  // namespace
}  // namespace gpurun::test

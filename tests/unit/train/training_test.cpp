// Unit tests of the training pieces: schedules, data order, state_dict order and digest,
// state capture/restore, gradient accumulation (cases 4 and 5), built-in models and idx data.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "unit/norms.h"

#include "builtin.h"
#include "checkpoint/format/state_copy.h"
#include "checkpoint/format/train_state.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "model/micro_batch_step.h"
#include "optim/lr_schedule.h"
#include "optim/torch_optimizer.h"
#include "train/device.h"
#include "util/rng.h"

namespace gpurun {
namespace {

using test::relative_norm_difference;

/// A linear model on a small synthetic data set: no dropout, no BatchNorm.
std::shared_ptr<SegmentedModel> linear_model(int64_t in, int64_t out) {
  auto model = std::make_shared<SegmentedModel>();
  model->add_segment("fc", torch::nn::Sequential(torch::nn::Linear(in, out)));
  return model;
}

std::shared_ptr<TensorDataset> synthetic(int64_t n, int64_t in, int64_t classes) {
  torch::manual_seed(3);
  return std::make_shared<TensorDataset>(torch::randn({n, in}), torch::randint(classes, {n}));
}

std::vector<at::Tensor> gradients(const torch::nn::Module& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.grad().clone());
  return out;
}

at::Tensor flat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  for (const auto& t : tensors) parts.push_back(t.reshape(-1));
  return at::cat(parts);
}

TEST(Schedule, WarmupThenCosineReachesTheFloor) {
  OptimConfig optim;
  optim.lr = 0.1;
  ScheduleConfig s;
  s.name = "cosine";
  s.warmup_steps = 10;
  s.min_lr = 0.001;
  EXPECT_DOUBLE_EQ(learning_rate(optim, s, 0, 110), 0.01);
  EXPECT_DOUBLE_EQ(learning_rate(optim, s, 9, 110), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(optim, s, 10, 110), 0.1);
  EXPECT_NEAR(learning_rate(optim, s, 109, 110), 0.001, 1e-12);
  EXPECT_NEAR(learning_rate(optim, s, 59, 110),
              0.001 + 0.099 * 0.5 * (1 + std::cos(M_PI * 49 / 99.0)), 1e-12);
}

TEST(Schedule, StepDecay) {
  OptimConfig optim;
  optim.lr = 1.0;
  ScheduleConfig s;
  s.name = "step";
  s.step_size = 5;
  s.gamma = 0.5;
  EXPECT_DOUBLE_EQ(learning_rate(optim, s, 4, 100), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(optim, s, 5, 100), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(optim, s, 12, 100), 0.25);
}

TEST(DataOrder, EpochPermutationIsAPureFunctionOfSeedAndEpoch) {
  at::Tensor a = epoch_permutation(1000, 7, 3);
  torch::manual_seed(123);  // the global generator must not matter
  at::Tensor b = epoch_permutation(1000, 7, 3);
  EXPECT_TRUE(a.equal(b));
  EXPECT_FALSE(a.equal(epoch_permutation(1000, 7, 4)));
  EXPECT_FALSE(a.equal(epoch_permutation(1000, 8, 3)));
  EXPECT_TRUE(std::get<0>(a.sort()).equal(at::arange(1000, at::kLong)));
}

TEST(StateDict, PyTorchOrderAndDigestSeesEveryBit) {
  Registry registry;
  register_builtin_plugins(registry);
  ModelConfig c;
  c.name = "cnn";
  c.channels = {4};
  c.batch_norm = true;
  auto model = registry.make_model(c, {1, 28, 28}, 10);
  std::vector<std::string> names;
  for (const auto& [name, tensor] : state_dict(*model)) names.push_back(name);
  const std::vector<std::string> expected{"block0.0.weight",      "block0.1.weight",
                                          "block0.1.bias",        "block0.1.running_mean",
                                          "block0.1.running_var", "block0.1.num_batches_tracked",
                                          "head.1.weight",        "head.1.bias",
                                          "head.3.weight",        "head.3.bias"};
  EXPECT_EQ(names, expected);
  const std::string before = model_digest(*model);
  EXPECT_EQ(before.size(), 16u);
  {
    torch::NoGradGuard no_grad;
    float* w = model->parameters()[0].data_ptr<float>();
    w[0] = std::nextafter(w[0], 1e9f);  // one ulp
  }
  EXPECT_NE(model_digest(*model), before);
}

TEST(State, CudaGeneratorOfTheModelsDeviceIsSavedAndRestored_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const c10::Device cuda = select_device("cuda", 0);
  auto model = linear_model(8, 3);
  model->to(cuda);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::cuda::manual_seed_all(7);
  const CheckpointSnapshot snap = capture_state(*model, sgd, {});
  const at::Tensor dropout_noise = at::rand({16}, at::TensorOptions().device(cuda));
  torch::cuda::manual_seed_all(8);  // a fresh process: another stream
  LoadedCheckpoint loaded;
  loaded.info.path = "memory";
  loaded.files = snap.files;
  ASSERT_TRUE(restore_state(loaded, *model, sgd));
  EXPECT_TRUE(at::rand({16}, at::TensorOptions().device(cuda)).equal(dropout_noise))
      << "the CUDA generator was not restored";
  bool has_cuda_state = false;
  for (const auto& [name, state] : unpickle_tensors(loaded.file("trainer.pt"), "trainer.pt"))
    has_cuda_state = has_cuda_state || name == "cuda_rng_state";
  EXPECT_TRUE(has_cuda_state);
}

TEST(Device, LocalRankBecomesTheCurrentCudaDevice_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int last = static_cast<int>(torch::cuda::device_count()) - 1;
  const c10::Device d = select_device("auto", last);
  EXPECT_EQ(d, c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(last)));
  EXPECT_EQ(at::empty({1}, at::TensorOptions().device(c10::kCUDA)).device().index(), last);
  EXPECT_THROW(select_device("cuda", last + 1), ConfigError);
  select_device("cuda", 0);
}

TEST(Device, AutoWithoutAGpuIsTheCpuAndNamesAreChecked) {
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(select_device("auto", 0), c10::Device(c10::kCPU));
    EXPECT_THROW(select_device("cuda", 0), ConfigError);
  }
  EXPECT_EQ(select_device("cpu", 3), c10::Device(c10::kCPU));
  EXPECT_THROW(select_device("gpu", 0), ConfigError);
}

TEST(State, CaptureRestoreBringsBackWeightsOptimizerAndRng) {
  auto data = synthetic(64, 8, 3);
  auto model = linear_model(8, 3);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto step = [&] {
    sgd.zero_grad();
    accumulate_gradients(*model, *data, at::arange(16, at::kLong), 16, at::kCPU);
    sgd.step();
  };
  step();
  CheckpointSnapshot snap = capture_state(*model, sgd, {});
  step();
  const std::string after_two = model_digest(*model);
  const at::Tensor noise = torch::rand({4});

  // A fresh model and optimizer, restored, continue identically (momentum buffers included).
  auto model2 = linear_model(8, 3);
  torch::optim::SGD sgd2(model2->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  LoadedCheckpoint loaded;
  loaded.info.path = "memory";
  loaded.files = snap.files;
  torch::manual_seed(999);
  restore_state(loaded, *model2, sgd2);
  EXPECT_EQ(model_digest(*model2), snap.meta.model_digest);
  sgd2.zero_grad();
  accumulate_gradients(*model2, *data, at::arange(16, at::kLong), 16, at::kCPU);
  sgd2.step();
  EXPECT_EQ(model_digest(*model2), after_two);
  EXPECT_TRUE(torch::rand({4}).equal(noise)) << "the global RNG was not restored";
}

// A save's stall is only the copy: its files are built later, on the writer thread, while
// training goes on. They must hold the state of the copy's step, not of a later one.
TEST(State, FilesBuiltAfterTrainingWentOnHoldTheStateOfTheCopysStep) {
  auto data = synthetic(64, 8, 3);
  auto model = linear_model(8, 3);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
  auto step = [&](auto& m, torch::optim::Optimizer& o) {
    o.zero_grad();
    accumulate_gradients(m, *data, at::arange(16, at::kLong), 16, at::kCPU);
    o.step();
  };
  for (int i = 0; i < 2; ++i) step(*model, adam);
  const CheckpointSnapshot reference = capture_state(*model, adam, {});
  HostStateCopy copy;
  copy.copy(*model, adam, trainer_rng_states(*model));
  EXPECT_GT(copy.copied_bytes(), 0);
  step(*model, adam);  // training goes on before the writer builds the files
  const std::string after_three = model_digest(*model);
  CheckpointSnapshot built;
  copy.build(built);
  built.materialize();  // build() gives streamed sources; capture_state() materializes its own

  EXPECT_EQ(built.meta.model_digest, reference.meta.model_digest);
  EXPECT_NE(built.meta.model_digest, after_three);
  ASSERT_EQ(built.files.size(), reference.files.size());
  for (size_t i = 0; i < built.files.size(); ++i)
    EXPECT_EQ(built.files[i].first, reference.files[i].first);
  const NamedTensors built_weights = unpickle_tensors(built.files[0].second, "model.pt");
  const NamedTensors reference_weights = unpickle_tensors(reference.files[0].second, "model.pt");
  ASSERT_EQ(built_weights.size(), reference_weights.size());
  for (size_t i = 0; i < built_weights.size(); ++i)
    EXPECT_TRUE(built_weights[i].second.equal(reference_weights[i].second))
        << built_weights[i].first;

  // Restored into a fresh model and Adam, one more step gives the live run's third step:
  // exp_avg, exp_avg_sq and the step count were those of step two.
  auto model2 = linear_model(8, 3);
  torch::optim::Adam adam2(model2->parameters(), torch::optim::AdamOptions(0.01));
  LoadedCheckpoint loaded;
  loaded.info.path = "memory";
  loaded.files = built.files;
  restore_state(loaded, *model2, adam2);
  step(*model2, adam2);
  EXPECT_EQ(model_digest(*model2), after_three);
}

// Case 4: 10 micro-batches per epoch, accumulation 4 -> windows 4, 4, 2; the last gradient is
// the mean over its 2 micro-batches.
TEST(Accumulation, ShortLastWindowIsTheMeanOverItsOwnSamples) {
  auto data = synthetic(40, 6, 4);  // 10 micro-batches of 4
  auto model = linear_model(6, 4);
  const at::Tensor order = at::arange(40, at::kLong);
  const int64_t micro = 4, global = 16;
  std::vector<int64_t> windows;
  for (int64_t pos = 0; pos < 40; pos += global) windows.push_back(std::min(global, 40 - pos));
  EXPECT_EQ(windows, (std::vector<int64_t>{16, 16, 8}));  // 3 optimizer steps: 4, 4, 2 micro

  model->zero_grad();
  accumulate_gradients(*model, *data, order.narrow(0, 32, 8), micro, at::kCPU);
  at::Tensor accumulated = flat(gradients(*model));
  // Reference: the mean of the two micro-batches' own gradients.
  std::vector<at::Tensor> per_micro;
  for (int64_t start : {32, 36}) {
    model->zero_grad();
    accumulate_gradients(*model, *data, order.narrow(0, start, 4), micro, at::kCPU);
    per_micro.push_back(flat(gradients(*model)));
  }
  at::Tensor mean = (per_micro[0] + per_micro[1]) / 2;
  EXPECT_LT(relative_norm_difference(accumulated, mean), 1e-6);
}

// Case 5: batch 8 vs micro-batch 2 x accumulation 4, clipping at 1.0, one SGD step.
TEST(Accumulation, LossIsDividedByTheWindowSoClippingAndUpdatesMatch) {
  torch::manual_seed(4);
  // Inputs scaled so that the gradient norm exceeds the clipping threshold.
  auto data = std::make_shared<TensorDataset>(torch::randn({8, 10}) * 10, torch::randint(5, {8}));
  const at::Tensor idx = at::arange(8, at::kLong);
  std::vector<double> norms;
  std::vector<at::Tensor> weights;
  for (int64_t micro : {8, 2}) {
    torch::manual_seed(11);
    auto model = linear_model(10, 5);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.5));
    sgd.zero_grad();
    accumulate_gradients(*model, *data, idx, micro, at::kCPU);
    norms.push_back(clip_grad_norm(model->parameters(), 1.0));
    sgd.step();
    weights.push_back(flat(model->parameters()).detach().clone());
  }
  EXPECT_GT(norms[0], 1.0) << "the test needs clipping to take effect";
  EXPECT_LT(std::abs(norms[0] - norms[1]) / norms[0], 1e-6);
  EXPECT_LT(relative_norm_difference(weights[1], weights[0]), 1e-6);
}

TEST(Accumulation, MicroBatch4TimesEightEqualsBatch32OverFiveSgdSteps) {
  auto data = synthetic(160, 12, 6);
  std::vector<at::Tensor> finals;
  for (int64_t micro : {32, 4}) {
    torch::manual_seed(5);
    auto model = linear_model(12, 6);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.2).momentum(0.9));
    for (int64_t step = 0; step < 5; ++step) {
      sgd.zero_grad();
      accumulate_gradients(*model, *data, at::arange(step * 32, step * 32 + 32, at::kLong), micro,
                           at::kCPU);
      sgd.step();
    }
    finals.push_back(flat(model->parameters()).detach().clone());
  }
  EXPECT_LT(relative_norm_difference(finals[1], finals[0]), 1e-5);
}

TEST(IdxDataset, LoadsFashionMnistSubsetsWithShapesAndClasses) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  Registry registry;
  register_builtin_plugins(registry);
  DataConfig c;
  c.train_samples = 500;
  c.eval_samples = 100;
  DatasetSplits splits = registry.make_dataset(c);
  EXPECT_EQ(splits.train->size(), 500);
  EXPECT_EQ(splits.eval->size(), 100);
  EXPECT_EQ(splits.input_shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(splits.num_classes, 10);
  Batch b = splits.train->get(at::arange(500, at::kLong));
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{500, 1, 28, 28}));
  EXPECT_EQ(b.inputs.scalar_type(), at::kFloat);
  EXPECT_NEAR(b.inputs.mean().item<double>(), 0.0, 1e-4);  // normalised by the split's stats
  EXPECT_NEAR(b.inputs.std().item<double>(), 1.0, 1e-3);
  EXPECT_EQ(b.targets.min().item<int64_t>(), 0);
  EXPECT_EQ(b.targets.max().item<int64_t>(), 9);
}

TEST(IdxDataset, BadFilesAreConfigErrorsNamingThePath) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "gpurun-idx-bad";
  fs::create_directories(dir);
  for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"})
    std::ofstream(dir / name) << "not an idx file";
  Registry registry;
  register_builtin_plugins(registry);
  DataConfig c;
  c.path = dir.string();
  try {
    registry.make_dataset(c);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train-images-idx3-ubyte"), std::string::npos) << e.what();
  }
  c.path = (dir / "missing").string();
  EXPECT_THROW(registry.make_dataset(c), ConfigError);
  fs::remove_all(dir);
}

TEST(Registry, UnknownModelNamesTheRegisteredOnes) {
  Registry registry;
  register_builtin_plugins(registry);
  ModelConfig c;
  c.name = "resnet9000";
  try {
    registry.make_model(c, {1, 28, 28}, 10);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("registered: cnn, gpt, hf, mlp, resnet"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace gpurun

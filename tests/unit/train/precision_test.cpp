// Unit tests of model/precision.h: the autocast guard, and optim/grad_scaler.h: the GradScaler
// against PyTorch's torch.amp.GradScaler run in Python on the same inputs (issue 12).
#include <ATen/autocast_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "gpurun/model.h"
#include "model/activation_checkpointing.h"
#include "model/precision.h"
#include "optim/grad_scaler.h"
#include "optim/torch_optimizer.h"

namespace gpurun {
namespace {

using test::TempDir;

using json = nlohmann::json;

TEST(Autocast, GuardRunsMatrixProductsInBf16AndNestsLikeTorchAutocast) {
  const at::Tensor x = at::full({2, 3}, 0.5), w = at::full({4, 3}, 0.25);
  ASSERT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  {
    AutocastGuard outer(Precision::kBf16, c10::Device(c10::kCPU));
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU));
    EXPECT_EQ(at::linear(x, w).scalar_type(), at::kBFloat16);
    {
      AutocastGuard inner(Precision::kBf16, c10::Device(c10::kCPU));
      EXPECT_EQ(at::linear(x, w).scalar_type(), at::kBFloat16);
    }
    // The inner guard's end leaves the outer one in force.
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU));
    EXPECT_EQ(at::linear(x, w).scalar_type(), at::kBFloat16);
    {
      AutocastGuard fp32(Precision::kFp32, c10::Device(c10::kCPU));  // does nothing
      EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU));
    }
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  EXPECT_EQ(at::linear(x, w).scalar_type(), at::kFloat);
  {
    AutocastGuard fp16(Precision::kFp16, c10::Device(c10::kCPU));
    EXPECT_EQ(at::linear(x, w).scalar_type(), at::kHalf);
  }
  EXPECT_EQ(at::autocast::get_autocast_dtype(at::kCPU), at::kBFloat16);  // CPU's default back
}

TEST(Autocast, AutoResolvesToWhatTheDeviceComputesAndWordsAreChecked) {
  const ResolvedPrecision cpu = resolve_precision("auto", c10::Device(c10::kCPU));
  // Which one depends on this CPU's bf16 units; never fp16 on a CPU, and always said why.
  EXPECT_NE(cpu.precision, Precision::kFp16);
  EXPECT_NE(cpu.reason.find("auto: the CPU"), std::string::npos) << cpu.reason;
  EXPECT_EQ(resolve_precision("fp16", c10::Device(c10::kCPU)).precision, Precision::kFp16);
  EXPECT_EQ(std::string(precision_name(Precision::kBf16)), "bf16");
  EXPECT_THROW(resolve_precision("fp8", c10::Device(c10::kCPU)), std::exception);
}

TEST(Autocast, CheckpointedSegmentsRecomputeUnderTheForwardsAutocast) {
  // Two Linear segments: the second's input is bf16 (the first's output under autocast), which
  // a recomputation outside autocast would multiply with its float32 weight and fail.
  std::vector<std::vector<at::Tensor>> grads;
  for (const bool checkpointing : {false, true}) {
    torch::manual_seed(1);
    SegmentedModel model;
    model.add_segment("a", torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU()));
    model.add_segment("b", torch::nn::Sequential(torch::nn::Linear(16, 4)));
    checkpoint_every_segment(model, checkpointing);
    const at::Tensor x = at::randn({5, 8});
    at::Tensor loss;
    {
      AutocastGuard autocast(Precision::kBf16, c10::Device(c10::kCPU));
      loss = model.forward(x).to(at::kFloat).square().mean();
    }
    loss.backward();
    std::vector<at::Tensor> g;
    for (const auto& p : model.parameters()) g.push_back(p.grad().clone());
    grads.push_back(g);
  }
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_TRUE(at::equal(grads[0][i], grads[1][i])) << "parameter " << i;
}

/// The gradients of each step, as the unscaled values; inf and NaN mark overflowing steps.
std::vector<std::vector<float>> step_gradients() {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return {{0.5f, -1.0f, 2.0f, 0.25f}, {3.0f, 1.0f, -0.5f, 0.0f},  {0.1f, inf, 0.2f, 0.3f},
          {1.0f, 1.0f, 1.0f, 1.0f},   {-2.0f, 0.5f, 0.5f, 4.0f},  {0.2f, 0.2f, nan, 0.2f},
          {0.7f, -0.3f, 0.1f, 0.9f},  {5.0f, -5.0f, 5.0f, -5.0f}, {0.0f, 0.1f, 0.0f, 0.1f}};
}

/// Per step: scale before the step, whether it stepped, the parameters after, the growth tracker.
json run_ours(double max_norm) {
  at::Tensor p = at::tensor({1.0f, 2.0f, -1.0f, 0.5f}).requires_grad_(true);
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
  GradScaler::Options options;
  options.growth_interval = 2;
  GradScaler scaler(c10::Device(c10::kCPU), options);
  json steps = json::array();
  for (const auto& g : step_gradients()) {
    const double scale = scaler.scale_value();
    // What the backward of the scaled loss leaves in .grad: the gradient times the scale.
    p.mutable_grad() = at::tensor(g) * scaler.scale();
    scaler.unscale({p});
    if (max_norm > 0) clip_grad_norm({p}, max_norm);
    const bool stepped = scaler.step(sgd, {p});
    scaler.update();
    std::vector<float> after(p.data_ptr<float>(), p.data_ptr<float>() + 4);
    steps.push_back({{"scale", scale},
                     {"stepped", stepped},
                     {"params", after},
                     {"tracker", scaler.state_dict()["_growth_tracker"]}});
  }
  return steps;
}

/// step_gradients() as a Python list literal.
std::string python_gradients() {
  std::string out = "[";
  for (const auto& g : step_gradients()) {
    out += "[";
    for (const float v : g)
      out += (std::isinf(v)   ? std::string("math.inf")
              : std::isnan(v) ? "math.nan"
                              : std::to_string(v)) +
             ", ";
    out += "], ";
  }
  return out + "]";
}

json run_pytorch(const TempDir& dir, double max_norm) {
  const std::string script = dir / "scaler.py", out = dir / "pytorch.json";
  std::ofstream(script) << "import json, math, sys, torch\n"
                        << "grads = " << python_gradients() << "\n"
                        << R"(max_norm = float(sys.argv[1])
p = torch.tensor([1.0, 2.0, -1.0, 0.5], requires_grad=True)
sgd = torch.optim.SGD([p], lr=0.1)
scaler = torch.amp.GradScaler("cpu", growth_interval=2)
steps = []
for g in grads:
    scale = scaler.get_scale()
    sgd.zero_grad()
    scaler.scale((p * torch.tensor(g)).sum()).backward()  # p.grad = g x scale
    scaler.unscale_(sgd)
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_([p], max_norm)
    before = p.detach().clone()
    scaler.step(sgd)
    scaler.update()
    steps.append({"scale": scale, "stepped": not torch.equal(before, p.detach()),
                  "params": p.detach().tolist(),
                  "tracker": scaler.state_dict()["_growth_tracker"]})
json.dump(steps, open(sys.argv[2], "w"))
)";
  const std::string command = std::string(GPURUN_PYTHON) + " " + script + " " +
                              std::to_string(max_norm) + " " + out + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buf[512];
  while (pipe && std::fgets(buf, sizeof buf, pipe)) output += buf;
  const int status = pipe ? pclose(pipe) : -1;
  EXPECT_EQ(status, 0) << command << "\n" << output;
  std::ifstream in(out);
  return json::parse(in, nullptr, false);
}

void expect_same_as_pytorch(double max_norm) {
  TempDir dir;
  const json ours = run_ours(max_norm), theirs = run_pytorch(dir, max_norm);
  ASSERT_TRUE(theirs.is_array()) << theirs.dump();
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    EXPECT_EQ(ours[i]["scale"].get<double>(), theirs[i]["scale"].get<double>());
    EXPECT_EQ(ours[i]["stepped"], theirs[i]["stepped"]);
    EXPECT_EQ(ours[i]["tracker"], theirs[i]["tracker"]);
    for (size_t k = 0; k < 4; ++k)
      EXPECT_NEAR(ours[i]["params"][k].get<double>(), theirs[i]["params"][k].get<double>(), 1e-6);
  }
  // The schedule the inputs were chosen for: an overflow halves the scale and skips the
  // step; two clean steps in a row (growth_interval 2) double it.
  EXPECT_EQ(ours[2]["stepped"], false);
  EXPECT_EQ(ours[3]["scale"].get<double>(), ours[2]["scale"].get<double>() / 2);
  EXPECT_EQ(ours[5]["stepped"], false);  // NaN
  EXPECT_EQ(ours[5]["scale"].get<double>(), ours[3]["scale"].get<double>() * 2);
  EXPECT_EQ(ours[6]["scale"].get<double>(), ours[5]["scale"].get<double>() / 2);
  EXPECT_EQ(ours[8]["scale"].get<double>(), ours[6]["scale"].get<double>() * 2);
}

TEST(GradScaler, OverflowSkipsTheStepAndHalvesTheScaleGrowthAfterTheIntervalAsPyTorch) {
  expect_same_as_pytorch(0);
}

TEST(GradScaler, UnscalesBeforeClippingAsPyTorch) {
  // With max_norm 1 the clipped gradients are of the unscaled ones: clipping scaled gradients
  // would leave the update 65536 times too small, which the parameters would show.
  expect_same_as_pytorch(1.0);
}

TEST(GradScaler, StateDictRoundTripsAndASecondUnscaleIsRefused) {
  GradScaler a(c10::Device(c10::kCPU));
  at::Tensor p = at::tensor({1.0f}).requires_grad_(true);
  p.mutable_grad() = at::tensor({std::numeric_limits<float>::infinity()});
  a.unscale({p});
  EXPECT_THROW(a.unscale({p}), std::logic_error);
  a.update();
  const json state = a.state_dict();
  EXPECT_EQ(state["scale"].get<double>(), 32768.0);
  EXPECT_EQ(state["growth_interval"], 2000);
  GradScaler b(c10::Device(c10::kCPU));
  b.load_state_dict(state);
  EXPECT_EQ(b.state_dict(), state);
  EXPECT_THROW(b.load_state_dict(json{{"scale", "big"}}), std::exception);
}

}  // namespace
}  // namespace gpurun

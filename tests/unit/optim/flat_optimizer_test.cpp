// Unit tests of optim/: the flat layout, and the sharded optimizer against the replicated one
// (LibTorch's AdamW with DDP's all-reduce) over a real Gloo process group on 127.0.0.1, ranks
// as threads of this process.

#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "unit/norms.h"

#include "distributed/collectives.h"
#include "gpurun/dataset.h"
#include "gpurun/model.h"
#include "memory/meter.h"
#include "model/micro_batch_step.h"
#include "model/precision.h"
#include "optim/flat_layout.h"
#include "optim/flat_optimizer.h"
#include "optim/grad_scaler.h"
#include "optim/step_optimizer.h"

namespace gpurun {
namespace {

using test::relative_norm_difference;

TEST(FlatLayout, AlignedOffsetsPaddedSlicesAndPiecesThatCoverEveryParameterOnce) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> params = {
      {"a.weight", {33, 20}}, {"a.bias", {33}}, {"b.weight", {7, 33}}, {"b.bias", {7}}};
  for (int64_t n = 1; n <= 4; ++n) {
    const FlatLayout layout(params, n);
    EXPECT_EQ(layout.numel(), 33 * 20 + 33 + 7 * 33 + 7);
    EXPECT_EQ(layout.padded_numel() % (n * FlatLayout::kAlignment), 0);
    for (const FlatParameter& p : layout.parameters())
      EXPECT_EQ(p.offset % FlatLayout::kAlignment, 0) << p.name;
    std::vector<int64_t> covered(params.size(), 0);
    for (int64_t r = 0; r < n; ++r) {
      const ElementRange s = layout.shard(r);
      EXPECT_EQ(s.size(), layout.shard_numel());
      int64_t last = s.begin;
      for (const FlatPiece& piece : layout.pieces(s)) {
        EXPECT_GE(piece.flat_begin, last);  // in buffer order, inside the slice
        last = piece.flat_begin + piece.param_range.size();
        EXPECT_LE(last, s.end);
        covered[piece.parameter] += piece.param_range.size();
      }
    }
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_EQ(covered[i], layout.parameters()[i].numel) << "world " << n << ", " << i;
  }
  EXPECT_THROW(FlatLayout(params, 0), std::invalid_argument);
  EXPECT_THROW(FlatLayout(params, 2).shard(2), std::out_of_range);
  EXPECT_EQ((ElementRange{0, 10}.intersect({5, 20})), (ElementRange{5, 10}));
  EXPECT_TRUE((ElementRange{0, 10}.intersect({10, 20})).empty());
}

/// Linear(20, 33) + ReLU + Linear(33, 7): 931 parameters, not divisible by 3 or 2.
std::shared_ptr<SegmentedModel> model() {
  torch::manual_seed(11);
  auto m = std::make_shared<SegmentedModel>();
  m->add_segment("a", torch::nn::Sequential(torch::nn::Linear(20, 33), torch::nn::ReLU()));
  m->add_segment("b", torch::nn::Sequential(torch::nn::Linear(33, 7)));
  return m;
}

std::vector<std::pair<std::string, at::Tensor>> named(SegmentedModel& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& e : m.named_parameters()) out.emplace_back(e.key(), e.value());
  return out;
}

at::Tensor flat_weights(SegmentedModel& m) {
  std::vector<at::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().reshape(-1).to(at::kFloat));
  return at::cat(parts);
}

constexpr int64_t kGlobal = 24, kSteps = 4;

struct RankResult {
  at::Tensor weights;  // after the last step
  double norm = 0;     // the last step's gradient norm
  int64_t state_bytes = 0;
  int64_t moved_bytes = 0;
  std::string error;
};

struct RunSetup {
  OptimizerPlacement placement;
  std::string optimizer = "adamw";
  double grad_clip = 1e9;  // computes the norm, clips nothing
  bool fp16 = false;
  c10::Device device = c10::kCPU;
  bool collectives_at_one_rank = false;  // a process group of one (NCCL's path on one card)
};

/// kSteps optimizer steps of `world` ranks (threads), rank r taking every world-th sample of
/// each step's window, as the trainer shards it.
std::vector<RankResult> train(int world, const RunSetup& setup) {
  torch::manual_seed(3);
  TensorDataset data(torch::randn({kGlobal * kSteps, 20}), torch::randint(7, {kGlobal * kSteps}));
  OptimConfig optim;
  optim.name = setup.optimizer;
  optim.lr = 0.01;
  optim.weight_decay = 0.1;
  optim.momentum = setup.optimizer == "sgd" ? 0.9 : 0.0;
  std::vector<RankResult> results(static_cast<size_t>(world));
  std::vector<std::shared_ptr<SegmentedModel>> models;
  for (int r = 0; r < world; ++r) {
    models.push_back(model());
    models.back()->to(setup.device);
  }
  const int port = find_free_port();
  auto rank_main = [&](int rank) {
    RankResult& out = results[static_cast<size_t>(rank)];
    try {
      std::unique_ptr<Collectives> comm;
      if (world > 1 || setup.collectives_at_one_rank) {
        DistEnv env;
        env.rank = env.local_rank = rank;
        env.world_size = env.local_world_size = world;
        env.master_port = port;
        comm = Collectives::connect(env, setup.device, 60);
      }
      SegmentedModel& m = *models[static_cast<size_t>(rank)];
      auto opt = make_step_optimizer(optim, setup.placement, named(m), comm.get(),
                                     setup.fp16 ? at::kHalf : at::kBFloat16);
      std::optional<GradScaler> scaler;
      if (setup.fp16) scaler.emplace(setup.device);
      const Precision precision = setup.placement.master_weights
                                      ? (setup.fp16 ? Precision::kFp16 : Precision::kBf16)
                                      : Precision::kFp32;
      for (int64_t step = 0; step < kSteps; ++step) {
        opt->zero_grad();
        const at::Tensor window = torch::arange(step * kGlobal, (step + 1) * kGlobal);
        const at::Tensor shard = window.slice(0, rank, kGlobal, world).contiguous();
        accumulate_gradients(m, data, shard, 4, setup.device, kGlobal, cross_entropy,
                             {precision, scaler ? scaler->scale() : at::Tensor()});
        std::vector<double> control{1.0};
        opt->reduce_gradients(control);
        EXPECT_EQ(control[0], world);
        if (scaler) opt->unscale(*scaler);
        out.norm = opt->clip_grad_norm(setup.grad_clip);
        opt->step(0.01, scaler ? &*scaler : nullptr);
        if (scaler) scaler->update();
      }
      out.weights = flat_weights(m).cpu();
      if (FlatOptimizer* flat = opt->flat()) out.state_bytes = flat->state_bytes();
      if (comm) out.moved_bytes = comm->stats().moved_bytes(world);
    } catch (const std::exception& e) {
      out.error = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();
  for (const RankResult& r : results) EXPECT_EQ(r.error, "");
  return results;
}

RunSetup sharded(const std::string& mode = "optimizer") {
  RunSetup s;
  s.placement.shard = mode;
  return s;
}

// The sharded update is ATen's fused AdamW on the slice, the replicated one LibTorch's AdamW
// per parameter: the same update rule, evaluated in another order of float operations (and
// the gradients summed by another collective), so the two agree to float rounding, not bit
// for bit. 1e-5 relative after 4 steps is 100 x float32's epsilon.
constexpr double kTolerance = 1e-5;

void expect_sharded_equals_ddp(int world, const std::string& mode, const std::string& optimizer) {
  RunSetup ddp;
  ddp.optimizer = optimizer;
  RunSetup flat = sharded(mode);
  flat.optimizer = optimizer;
  const auto replicated = train(world, ddp);
  const auto shards = train(world, flat);
  ASSERT_EQ(shards.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    // Every rank holds the same weights after the all-gather, bit for bit.
    EXPECT_TRUE(shards[r].weights.equal(shards[0].weights)) << "rank " << r;
    EXPECT_LT(relative_norm_difference(shards[r].weights, replicated[r].weights), kTolerance)
        << "rank " << r;
    EXPECT_NEAR(shards[r].norm, replicated[r].norm, 1e-5 * replicated[r].norm) << "rank " << r;
    EXPECT_EQ(shards[r].norm, shards[0].norm);  // the same value on every rank
  }
  if (world > 1) {
    // Reduce-scatter + all-gather of fp32 moves what the all-reduce moves (padding aside).
    const double ratio = static_cast<double>(shards[0].moved_bytes) / replicated[0].moved_bytes;
    EXPECT_NEAR(ratio, 1.0, 0.25) << shards[0].moved_bytes << " vs " << replicated[0].moved_bytes;
  }
}

TEST(FlatOptimizer, ShardedAdamWOverTwoRanksEqualsDdp) {
  expect_sharded_equals_ddp(2, "optimizer", "adamw");
}

TEST(FlatOptimizer, ShardedOverThreeRanksWithAParameterCountNotDivisibleByThreeEqualsDdp) {
  expect_sharded_equals_ddp(3, "gradients", "adam");
}

TEST(FlatOptimizer, ShardedSgdWithMomentumEqualsDdp) {
  expect_sharded_equals_ddp(2, "optimizer", "sgd");
}

TEST(FlatOptimizer, OneRankFlatEqualsLibTorchsAdamW) {
  expect_sharded_equals_ddp(1, "optimizer", "adamw");
}

std::vector<std::pair<std::string, std::vector<int64_t>>> model_shapes() {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& [name, p] : named(*model())) shapes.emplace_back(name, p.sizes().vec());
  return shapes;
}

TEST(FlatOptimizer, EachRankHoldsTheStateOfItsSliceAndTheRanksTogetherTheWhole) {
  const int64_t parameters = FlatLayout(model_shapes(), 1).numel();
  for (const int world : {2, 3}) {
    const FlatLayout layout(model_shapes(), world);
    const auto results = train(world, sharded());
    int64_t total = 0;
    for (const RankResult& r : results) {
      // exp_avg and exp_avg_sq: 2 x 4 bytes over the slice.
      EXPECT_EQ(r.state_bytes, 8 * layout.shard_numel());
      total += r.state_bytes;
    }
    // The unsharded state, 8 bytes per parameter, plus the padding's: each parameter is
    // aligned to 64 elements, and the buffer to world x 64.
    EXPECT_GE(total, 8 * parameters);
    EXPECT_LE(total, 8 * (parameters + (4 + world) * FlatLayout::kAlignment));
  }
}

TEST(FlatOptimizer, OffloadToTheHostGivesTheSameWeightsBitForBit) {
  RunSetup offload = sharded();
  offload.placement.offload = true;
  const auto on_device = train(2, sharded());
  const auto on_host = train(2, offload);
  for (size_t r = 0; r < on_host.size(); ++r)
    EXPECT_TRUE(on_host[r].weights.equal(on_device[r].weights)) << "rank " << r;
  // With offload the master slice is kept too: moments and master, 12 bytes per element.
  EXPECT_EQ(on_host[0].state_bytes * 2, on_device[0].state_bytes * 3);
}

TEST(FlatOptimizer, MasterWeightsHoldTheModelIn16BitsAndTrainCloseToFp32) {
  RunSetup master = sharded();
  master.placement.master_weights = true;
  const auto fp32 = train(2, sharded());
  const auto bf16 = train(2, master);
  EXPECT_TRUE(bf16[0].weights.equal(bf16[1].weights));
  // bf16 weights and autocast: 8 bits of mantissa, so a loose tolerance.
  EXPECT_LT(relative_norm_difference(bf16[0].weights, fp32[0].weights), 2e-2);
  // Moments and the master slice.
  EXPECT_EQ(bf16[0].state_bytes * 2, fp32[0].state_bytes * 3);
}

TEST(FlatOptimizer, Fp16MasterWeightsWithAGradScalerAgreeOnEveryRank) {
  RunSetup fp16 = sharded();
  fp16.placement.master_weights = true;
  fp16.fp16 = true;
  const auto results = train(2, fp16);
  EXPECT_TRUE(results[0].weights.equal(results[1].weights));
  EXPECT_TRUE(torch::isfinite(results[0].weights).all().item<bool>());
}

TEST(FlatOptimizer, ClippingUsesTheGlobalNormOfAllShards) {
  RunSetup ddp;
  ddp.grad_clip = 0.05;
  RunSetup flat = sharded();
  flat.grad_clip = 0.05;
  const auto replicated = train(3, ddp);
  const auto shards = train(3, flat);
  for (size_t r = 0; r < shards.size(); ++r) {
    EXPECT_NEAR(shards[r].norm, replicated[r].norm, 1e-5 * replicated[r].norm);
    EXPECT_LT(relative_norm_difference(shards[r].weights, replicated[r].weights), kTolerance);
  }
}

// Issue 40, item 2: the norm of a slice of 2.5 chunks, measured under the CPU allocator's meter.
// A float64 copy of the slice and its square took 16 bytes an element (160 MB here, 121 GiB a
// rank for a 7B on 2 ranks); a chunk at a time the temporaries are one chunk's float64 copy.
// The value is the whole slice's float64 norm, and clipping scales it to max_norm.
TEST(FlatOptimizer, ClippingNeedsOneFloat64ChunkNotACopyOfTheSlice) {
  const int64_t n = FlatLayout::kClipChunkElements * 5 / 2;
  torch::manual_seed(3);
  at::Tensor weight = torch::zeros({n}).set_requires_grad(true);
  FlatOptimizer opt(OptimConfig{}, {}, {{"w", weight}}, nullptr);
  opt.zero_grad();
  weight.mutable_grad().copy_(torch::randn({n}));
  const double expected = weight.grad().to(at::kDouble).norm().item<double>();
  std::vector<double> control;
  opt.reduce_gradients(control);
  auto meter = make_cpu_meter(0);
  const double norm = opt.clip_grad_norm(1.0);
  const int64_t peak = meter->peak_bytes();
  meter.reset();
  EXPECT_NEAR(norm, expected, 1e-12 * expected);
  EXPECT_LE(peak, 8 * FlatLayout::kClipChunkElements + 4096) << "bytes of temporaries";
  EXPECT_GE(peak, 8 * FlatLayout::kClipChunkElements);  // the chunk copy, counted
  EXPECT_NEAR(weight.grad().to(at::kDouble).norm().item<double>(), 1.0, 1e-5);
}

TEST(FlatOptimizer, ParametersOfMixedDtypesAreAConfigError) {
  auto m = model();
  auto params = named(*m);
  params[1].second.set_data(params[1].second.to(at::kDouble));
  EXPECT_THROW(FlatOptimizer(OptimConfig{}, {}, params, nullptr), ConfigError);
}

// On a card, through ProcessGroupNCCL with one rank: the reduce-scatter and all-gather of the
// sharded step, 16-bit weights with fp32 masters, and the state offloaded to pinned host
// memory, each against the replicated step on the same card.
TEST(FlatOptimizer, NcclOneRankShardedMasterWeightsAndOffload_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  RunSetup ddp;
  ddp.device = c10::Device(c10::kCUDA, 0);
  ddp.collectives_at_one_rank = true;
  const auto replicated = train(1, ddp);
  RunSetup flat = ddp;
  flat.placement.shard = "optimizer";
  EXPECT_LT(relative_norm_difference(train(1, flat)[0].weights, replicated[0].weights), kTolerance);
  RunSetup offload = flat;
  offload.placement.offload = true;  // the update on the CPU, its kernel another than CUDA's
  EXPECT_LT(relative_norm_difference(train(1, offload)[0].weights, replicated[0].weights),
            kTolerance);
  RunSetup master = flat;
  master.placement.master_weights = true;
  EXPECT_LT(relative_norm_difference(train(1, master)[0].weights, replicated[0].weights), 2e-2);
}

}  // namespace
}  // namespace gpurun

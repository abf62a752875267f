// The per-rank estimate of every placement (memory/rank_state.h) against flat_optimizer.h's
// formulas, written out by hand, and the choice of a placement (memory/placement.h): auto's
// order, offload, one rank, and the host as a second capacity.
#include <algorithm>

#include <gtest/gtest.h>

#include "gpurun/errors.h"
#include "memory/placement.h"
#include "memory/planner.h"
#include "memory/rank_state.h"
#include "optim/flat_layout.h"

namespace gpurun {
namespace {

/// 1013 trainable elements (not a multiple of 3): a 100 x 10 matrix and a vector of 13, plus 40
/// bytes of buffers: 8 fp32 values (32 bytes) and an int64 (BatchNorm's count). FlatLayout: the
/// matrix at 0, the vector at 1024 (aligned to 64), its end 1037 padded to a multiple of N x 64.
StateShape small_model() {
  StateShape s;
  s.trainable = {{"w", {100, 10}}, {"b", {13}}};
  s.other_bytes = 40;
  s.other_float_bytes = 32;
  s.other_float_numel = 8;
  return s;
}
constexpr int64_t kPsi = 1013, kMatrix = 1000;
constexpr int64_t kPadded[] = {0, 1088, 1152, 1152, 1280};  // P for N = 1..4
constexpr int64_t kSlice[] = {0, 1088, 576, 384, 320};      // S = P / N

OptimConfig adamw() {
  OptimConfig o;
  o.name = "adamw";
  return o;
}

OptimizerPlacement placement(const std::string& shard, bool master = false, bool offload = false) {
  OptimizerPlacement p;
  p.shard = shard;
  p.master_weights = master;
  p.offload = offload;
  return p;
}

TEST(RankState, ReplicatedIsTheEstimateOfEveryRankWhateverTheWorldSize) {
  for (int64_t n = 1; n <= 4; ++n) {
    const Estimate e = rank_state(small_model(), adamw(), Precision::kBf16, placement("none"), n);
    EXPECT_EQ(e.parameters, 40 + 4 * kPsi);
    EXPECT_EQ(e.gradients, 4 * kPsi);
    EXPECT_EQ(e.optimizer_state, 8 * kPsi);        // Adam's two moments
    EXPECT_EQ(e.weight_casts, 2 * kMatrix);        // autocast's bf16 copy of the matrix
    EXPECT_EQ(e.optimizer_temporaries, 8 * 1000);  // 2 x the largest parameter's bytes
    EXPECT_EQ(e.gradient_slice, 0);
    EXPECT_EQ(e.host_bytes, 0);
    EXPECT_FALSE(e.gradients_released);
    // 16 bytes a parameter, DDP's 16 Psi (ZeRO, Rajbhandari et al. 2020), plus the larger of
    // the casts (with the activations) and the step's temporaries.
    EXPECT_EQ(e.total(), 40 + 16 * kPsi + std::max<int64_t>(2 * kMatrix, 8 * 1000));
  }
  // fp32: no casts; SGD with momentum: 4 Psi of state; plain SGD: none.
  EXPECT_EQ(rank_state(small_model(), adamw(), Precision::kFp32, placement("none"), 1).weight_casts,
            0);
  OptimConfig sgd;
  sgd.name = "sgd";
  sgd.momentum = 0.9;
  EXPECT_EQ(rank_state(small_model(), sgd, Precision::kFp32, placement("none"), 2).optimizer_state,
            4 * kPsi);
  sgd.momentum = 0;
  EXPECT_EQ(rank_state(small_model(), sgd, Precision::kFp32, placement("none"), 2).optimizer_state,
            0);
}

TEST(RankState, ShardedOptimizerAndGradientsPerRankForOneToFourRanks) {
  for (int64_t n = 1; n <= 4; ++n) {
    SCOPED_TRACE("world size " + std::to_string(n));
    const int64_t p = kPadded[n], s = kSlice[n];
    const Estimate o =
        rank_state(small_model(), adamw(), Precision::kBf16, placement("optimizer"), n);
    EXPECT_EQ(o.parameters, 40 + 4 * p);  // fp32 parameter buffer
    EXPECT_EQ(o.gradients, 4 * p);        // fp32 gradient buffer
    EXPECT_FALSE(o.gradients_released);
    // The fp32 slice; one process's is the fp32 gradient buffer itself.
    const int64_t slice = n > 1 ? 4 * s : 0;
    EXPECT_EQ(o.gradient_slice, slice);
    EXPECT_EQ(o.optimizer_state, 8 * s);               // this rank's moments only
    EXPECT_EQ(o.weight_casts, 2 * kMatrix);            // fp32 weights are still cast
    const int64_t bucket = n > 1 ? 4 * p + 8 * s : 0;  // the bucket and the ring's 2 chunks
    EXPECT_EQ(o.optimizer_temporaries, bucket);        // the fused kernels allocate nothing
    EXPECT_EQ(o.host_bytes, 0);
    // The backward passes (gradients and autocast's casts) or the update (the gradients, the
    // fp32 slice from the reduce-scatter to the update, the buckets; the all-gather's send
    // buffer, a bucket of 4 s here, comes after the slice is freed).
    EXPECT_EQ(o.total(),
              40 + 4 * p + 8 * s + std::max(4 * p + 2 * kMatrix, 4 * p + slice + bucket));

    const Estimate g =
        rank_state(small_model(), adamw(), Precision::kBf16, placement("gradients"), n);
    EXPECT_TRUE(g.gradients_released);  // released after the reduce-scatter, not in the update
    EXPECT_EQ(g.gradients, o.gradients);
    // ... but alive through the backward passes (a local full accumulation): only the
    // update's part is smaller.
    EXPECT_EQ(g.total(), 40 + 4 * p + 8 * s + std::max(4 * p + 2 * kMatrix, slice + bucket));
    EXPECT_LE(g.total(), o.total());

    OptimConfig clipped = adamw();
    clipped.grad_clip = 1.0;
    const Estimate gc =
        rank_state(small_model(), clipped, Precision::kBf16, placement("gradients"), n);
    EXPECT_EQ(gc.optimizer_temporaries, std::max(bucket, 8 * s));  // or clipping's float64 copy
  }
  // A slice larger than clipping's chunk: the chunk's float64 copy (32 MiB), not the slice's.
  StateShape large;
  large.trainable = {{"w", {3 * FlatLayout::kClipChunkElements}}};
  OptimConfig clipped = adamw();
  clipped.grad_clip = 1.0;
  const Estimate e = rank_state(large, clipped, Precision::kBf16, placement("optimizer", true), 1);
  EXPECT_EQ(e.optimizer_temporaries, 8 * FlatLayout::kClipChunkElements);
}

TEST(RankState, MasterWeightsHoldTheModelIn16BitsAndOffloadMovesTheStateToTheHost) {
  for (int64_t n = 1; n <= 4; ++n) {
    SCOPED_TRACE("world size " + std::to_string(n));
    const int64_t p = kPadded[n], s = kSlice[n];
    const Estimate m =
        rank_state(small_model(), adamw(), Precision::kBf16, placement("optimizer", true), n);
    // bf16 parameter buffer; the buffers held in bf16 too: 8 x 2 bytes and the int64's 8.
    EXPECT_EQ(m.parameters, 24 + 2 * p);
    EXPECT_EQ(m.gradients, 2 * p);                // bf16 gradient buffer
    EXPECT_EQ(m.gradient_slice, 4 * s);           // fp32 slice, bf16 gradients cast
    EXPECT_EQ(m.optimizer_state, 8 * s + 4 * s);  // moments + fp32 master slice
    EXPECT_EQ(m.weight_casts, 0);                 // nothing to cast
    // The fp32 bucket of the reduce-scatter (at most 25 MiB) and the ring's two chunks of the
    // slice, with several ranks.
    EXPECT_EQ(m.optimizer_temporaries, n > 1 ? 4 * p + 8 * s : 0);
    EXPECT_EQ(m.host_bytes, 0);
    // ZeRO's mixed-precision layout counts 2 + 2 + 12/N bytes a parameter (stage 1, 4 Psi +
    // 12 Psi / N); gpurun adds the fp32 gradient slice, 4 / N. (Without activations, the bucket
    // of this small model's reduce-scatter is the larger temporary.)
    const int64_t bucket = n > 1 ? 4 * p + 8 * s : 0;
    EXPECT_EQ(m.total(), 24 + 4 * p + 16 * s + bucket);

    const Estimate h =
        rank_state(small_model(), adamw(), Precision::kBf16, placement("optimizer", true, true), n);
    EXPECT_EQ(h.optimizer_state, 0);
    EXPECT_EQ(h.host_bytes, 8 * s + 4 * s + 4 * s);  // moments, master, gradient copy
    EXPECT_EQ(h.total(), 24 + 4 * p + 4 * s + bucket);
  }
  // Offload without master weights still keeps an fp32 master slice on the host.
  const Estimate f =
      rank_state(small_model(), adamw(), Precision::kFp32, placement("gradients", false, true), 2);
  EXPECT_EQ(f.host_bytes, 16 * kSlice[2]);
  // Master weights are for 16-bit runs: under fp32 the weights stay fp32, no master slice.
  const Estimate fp32 =
      rank_state(small_model(), adamw(), Precision::kFp32, placement("optimizer", true), 2);
  EXPECT_EQ(fp32.parameters, 40 + 4 * kPadded[2]);
  EXPECT_EQ(fp32.optimizer_state, 8 * kSlice[2]);
  // A flat placement with shard none (master weights alone) cuts its state as optimizer does.
  EXPECT_EQ(
      rank_state(small_model(), adamw(), Precision::kBf16, placement("none", true), 3).total(),
      rank_state(small_model(), adamw(), Precision::kBf16, placement("optimizer", true), 3)
          .total());
  EXPECT_THROW(rank_state(small_model(), adamw(), Precision::kBf16, placement("optimizer"), 0),
               std::invalid_argument);
}

// The reduce-scatter's bucket: 25 MiB of fp32 at most, in columns of the [N, S] view
// (FlatLayout::bucket_columns()), and the ring's two chunks of a column's width, whatever the
// model's size (with 2 ranks, two buckets' worth).
TEST(RankState, ALargeModelsReduceScatterTemporariesAreTwoBucketsOf25MiB) {
  StateShape large;
  large.trainable = {{"w", {20'000'000}}};  // 80 MB of fp32: 2 ranks' slices of 40 MB each
  const Estimate e = rank_state(large, adamw(), Precision::kFp32, placement("optimizer"), 2);
  const int64_t columns = (int64_t{25} << 20) / (4 * 2) / 64 * 64;  // 3'276'800 a rank
  EXPECT_EQ(e.optimizer_temporaries, 2 * 4 * 2 * columns);
  EXPECT_LE(e.optimizer_temporaries, 2 * (int64_t{25} << 20));
  // A model that fits one bucket: the bucket is the whole padded buffer.
  EXPECT_EQ(rank_state(small_model(), adamw(), Precision::kFp32, placement("optimizer"), 2)
                .optimizer_temporaries,
            2 * 4 * kPadded[2]);
}

TEST(RankState, TheEstimatesStatePartsComeFromTheRankAndTheActivationsStay) {
  Estimate step;
  step.activations = 500;
  step.forward_flops_per_sample = 7;
  step.parameters = 1;  // replaced
  const Estimate state =
      rank_state(small_model(), adamw(), Precision::kBf16, placement("optimizer"), 2);
  const Estimate e = step.with_state(state);
  EXPECT_EQ(e.activations, 500);
  EXPECT_EQ(e.forward_flops_per_sample, 7);
  EXPECT_EQ(e.parameters, state.parameters);
  // The activations add to the backward passes' part, which may or may not be the larger.
  EXPECT_GE(e.total(), state.total());
  EXPECT_LE(e.total(), state.total() + 500);
  const Estimate back = Estimate::from_json(e.to_json());
  EXPECT_EQ(back.gradient_slice, e.gradient_slice);
  EXPECT_EQ(back.total(), e.total());
  EXPECT_EQ(Estimate::from_json(nlohmann::json{{"parameters", 5}}).gradient_slice, 0);
}

/// A model of the choice: each placement's smallest step needs `card` bytes a rank and `host`.
struct Needs {
  int64_t none = 100, optimizer = 70, gradients = 60, optimizer_offload = 40,
          gradients_offload = 35, host = 30;
  Estimate operator()(const OptimizerPlacement& p) const {
    Estimate e;
    if (p.offload) {
      e.parameters = p.shard == "gradients" ? gradients_offload : optimizer_offload;
      e.host_bytes = host;
    } else {
      e.parameters = p.shard == "gradients" ? gradients : p.shard == "optimizer" ? optimizer : none;
    }
    return e;
  }
};

PlacementChoice choose(PlacementRequest r, const Needs& needs = {}) {
  return choose_placement(r, needs, [&](const Estimate& e) { return e.total() <= r.usable_bytes; });
}

PlacementRequest ranks(int64_t n, int64_t usable) {
  PlacementRequest r;
  r.world_size = n;
  r.usable_bytes = usable;
  return r;
}

TEST(Placement, AutoIsReplicatedWhenItFitsElseOptimizerElseGradients) {
  PlacementChoice c = choose(ranks(4, 120));
  EXPECT_EQ(c.placement.shard, "none");
  EXPECT_FALSE(c.placement.offload);
  EXPECT_EQ(c.reason, "fits replicated");
  c = choose(ranks(4, 80));
  EXPECT_EQ(c.placement.shard, "optimizer");
  EXPECT_NE(c.reason.find("replicated needs 100 B a rank; optimizer fits"), std::string::npos)
      << c.reason;
  c = choose(ranks(4, 65));
  EXPECT_EQ(c.placement.shard, "gradients");
  EXPECT_NE(c.reason.find("optimizer needs 70 B a rank"), std::string::npos) << c.reason;
  // Nothing fits, offload not allowed: the smallest need, and why.
  c = choose(ranks(4, 50));
  EXPECT_EQ(c.placement.shard, "gradients");
  EXPECT_FALSE(c.placement.offload);
  EXPECT_NE(c.reason.find("nothing fits"), std::string::npos) << c.reason;
  // Another memory.strategy does not shard.
  PlacementRequest r = ranks(4, 50);
  r.strategy = MemoryStrategy::kAccumulate;
  EXPECT_EQ(choose(r).placement.shard, "none");
  // Master weights are kept as configured in every candidate.
  r = ranks(4, 80);
  r.master_weights = true;
  EXPECT_TRUE(choose(r).placement.master_weights);
}

TEST(Placement, OffloadAutoComesOnlyAfterShardingAndOnlyWhereTheHostHoldsIt) {
  PlacementRequest r = ranks(4, 50);
  r.offload = "auto";
  r.host_usable_bytes = 100;
  PlacementChoice c = choose(r);
  EXPECT_EQ(c.placement.shard, "optimizer");
  EXPECT_TRUE(c.placement.offload);
  EXPECT_NE(c.reason.find("30 B of host memory"), std::string::npos) << c.reason;
  r.usable_bytes = 80;  // fits without offload: no offload
  EXPECT_FALSE(choose(r).placement.offload);
  // The host is a second capacity: 4 ranks on this host x 30 B > 100 B.
  r.usable_bytes = 50;
  r.ranks_per_host = 4;
  c = choose(r);
  EXPECT_FALSE(c.placement.offload);
  EXPECT_NE(c.reason.find("120 B of host memory, more than its 100 B"), std::string::npos)
      << c.reason;
  EXPECT_EQ(host_need(Needs{}(placement("optimizer", false, true)), r), 120);
  // One rank: offload auto on the one card.
  r = ranks(1, 45);
  r.offload = "auto";
  Needs one_card;
  one_card.optimizer = one_card.gradients = 100;
  c = choose(r, one_card);
  EXPECT_EQ(c.placement.shard, "none");
  EXPECT_TRUE(c.placement.offload);
}

TEST(Placement, ShardWithOneRankIsAnInfoLineNotAnError) {
  PlacementRequest r = ranks(1, 120);
  r.shard = "optimizer";
  PlacementChoice c = choose(r);
  EXPECT_EQ(c.placement.shard, "none");
  EXPECT_NE(c.note.find("distributed.shard: optimizer with one rank"), std::string::npos) << c.note;
  r.shard = "auto";
  EXPECT_EQ(choose(r).note, "");
  // A fixed mode with several ranks is kept, fitting or not.
  r = ranks(2, 10);
  r.shard = "gradients";
  c = choose(r);
  EXPECT_EQ(c.placement.shard, "gradients");
  r.usable_bytes = 1000;
  EXPECT_EQ(choose(r).reason, "as configured");
}

TEST(Placement, AnOffloadTheHostCannotHoldIsRefusedWithTheNumbers) {
  PlacementRequest r = ranks(2, 1000);
  r.shard = "optimizer";
  r.offload = "host";
  r.host_usable_bytes = 50;
  r.ranks_per_host = 2;
  try {
    choose(r);
    FAIL() << "no refusal";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("optim.offload: host needs 30 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("x 2 ranks on this host = 60 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("the host has 50 bytes"), std::string::npos) << m;
  }
  r.host_usable_bytes = 60;
  EXPECT_TRUE(choose(r).placement.offload);
  r.host_usable_bytes = 0;  // not known: not checked
  EXPECT_TRUE(choose(r).placement.offload);
}

TEST(Placement, ThePlanRecordsItAndAnOlderPlanReadsReplicated) {
  MemoryPlan plan;
  plan.global_batch = plan.micro_batch = 4;
  plan.shard = "gradients";
  plan.offload = true;
  plan.shard_reason = "why";
  plan.host_bytes = 123;
  const nlohmann::json j = plan.to_json();
  EXPECT_EQ(j["shard"], "gradients");
  EXPECT_EQ(j["offload"], true);
  const MemoryPlan back = MemoryPlan::from_json(j);
  EXPECT_EQ(back.shard, "gradients");
  EXPECT_TRUE(back.offload);
  EXPECT_EQ(back.shard_reason, "why");
  EXPECT_EQ(back.host_bytes, 123);
  nlohmann::json old = j;
  for (const char* key : {"shard", "offload", "shard_reason", "host_bytes"}) old.erase(key);
  const MemoryPlan older = MemoryPlan::from_json(old);
  EXPECT_EQ(older.shard, "none");
  EXPECT_FALSE(older.offload);
  EXPECT_EQ(older.host_bytes, 0);
}

}  // namespace
}  // namespace gpurun

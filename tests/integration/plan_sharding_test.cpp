// `gpurun plan` counts cards (issue 29, item 5): the README's 7B gpt on 80 GB cards needs a few
// of them sharded, or one with its optimizer state offloaded to host memory; and the bad inputs
// of sharding and offload: distributed.shard with one rank is an info line, an offload the host
// cannot hold is exit 2 with the numbers.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

/// README's 7B (scripts/bench/estimate.sh): 32 blocks of width 4096, context 2048, bf16, AdamW,
/// with master weights (the model held in bf16, an fp32 master slice in the optimizer).
const char* kGpt7B =
    "model: {name: gpt, layers: 32, heads: 32, width: 4096, dropout: 0}\n"
    "data: {name: text, path: /usr/local/share/gpurun/kjv.txt, context: 2048, "
    "train_samples: 1000, eval_samples: 100}\n"
    "optim: {name: adamw, lr: 0.0003, master_weights: true}\n"
    "train: {epochs: 1, batch_size: 8, precision: bf16}\n";

TEST(PlanSharding, The7BGptFitsOnAFew80GBCardsShardedOrOneWithOffload) {
  TempDir dir;
  const std::string config = write_config(dir, kGpt7B);
  const std::string cards = write_config(
      dir,
      "cards:\n  - {name: eighty, memory: 80GB, bf16_tflops: 989, price_per_hour: 20}\n"
      "  - {name: eighty-two, memory: 80GB, bf16_tflops: 312}\n",
      "cards.yaml");
  const Result plan = run_gpurun(
      {"plan", config, "--cards", cards, "--world-size", "4", "--estimate-only", "--json"}, {},
      180);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_LT(plan.seconds, 60) << plan.err;
  EXPECT_LT(plan.max_rss_bytes, 4 * kGiB) << plan.err;
  const nlohmann::json j = nlohmann::json::parse(plan.out);
  EXPECT_GT(j["parameters"]["total"].get<int64_t>(), 6'000'000'000);
  ASSERT_EQ(j["cards"].size(), 2u) << plan.out;
  for (const auto& c : j["cards"]) {
    EXPECT_EQ(c["fits"], "no") << c;  // replicated, no single 80 GB card holds it
    ASSERT_TRUE(c["cards_to_fit"].is_number_integer()) << c;
    EXPECT_GE(c["cards_to_fit"].get<int64_t>(), 2) << c;
    EXPECT_LE(c["cards_to_fit"].get<int64_t>(), 8) << c;
    EXPECT_LE(c["cards_to_fit_bytes"].get<int64_t>(), 72'000'000'000) << c;  // 10% headroom
    ASSERT_TRUE(c["offload"].is_object()) << c;
    EXPECT_TRUE(c["offload"]["fits"].is_boolean()) << c;
    // Adam's moments, the fp32 master and a gradient copy: 16 bytes a parameter.
    EXPECT_GT(c["offload"]["host_bytes"].get<int64_t>(), 16 * int64_t{6'000'000'000}) << c;
    EXPECT_TRUE(contains(c["note"].get<std::string>(), "sharded over")) << c;
  }
  // The breakdown is per rank of 4, and every placement is there.
  EXPECT_EQ(j["world_size"], 4);
  const nlohmann::json& b = j["breakdown_checkpointed"];
  EXPECT_GT(b["gradient_slice"].get<int64_t>(), 0) << b;
  EXPECT_LT(b["optimizer_state"].get<int64_t>(), 20'000'000'000) << b;  // 12 bytes / 4 ranks
  std::vector<std::string> names;
  for (const auto& m : j["modes"]) names.push_back(m["name"].get<std::string>());
  for (const char* name : {"replicated", "optimizer", "gradients", "optimizer + master weights",
                           "gradients + master weights + offload"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
}

TEST(PlanSharding, ShardWithOneRankIsAnInfoLineNotAnError) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(256, 32, 1));
  const Result plan =
      run_gpurun({"plan", config, "--set", "distributed.shard=optimizer", "--json"}, {}, 180);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_TRUE(contains(plan.err, "distributed.shard: optimizer with one rank")) << plan.err;
  const nlohmann::json j = nlohmann::json::parse(plan.out);
  EXPECT_EQ(j["shard"], "none");
  EXPECT_EQ(j["offload"], false);
}

TEST(PlanSharding, AnOffloadTheHostCannotHoldIsExit2WithTheNumbers) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(256, 32, 1));
  const std::vector<std::string> sets{"--set", "optim.offload=host"};
  const Env host{{"GPURUN_HOST_MEMORY", "1KiB"}};
  std::vector<std::string> args{"plan", config};
  args.insert(args.end(), sets.begin(), sets.end());
  const Result plan = run_gpurun(args, host, 180);
  EXPECT_EQ(plan.exit_code, 2) << plan.err;
  EXPECT_TRUE(contains(plan.err, "optim.offload: host needs")) << plan.err;
  EXPECT_TRUE(contains(plan.err, "the host has 1024 bytes")) << plan.err;
  // The run is refused before anything is built or trained.
  std::vector<std::string> run{config, "--ckpt", dir / "ckpt"};
  run.insert(run.end(), sets.begin(), sets.end());
  const Result r = run_gpurun(run, host, 180);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "optim.offload: host needs")) << r.err;
  EXPECT_FALSE(contains(r.err, "probing")) << r.err;
}

}  // namespace
}  // namespace gpurun::test

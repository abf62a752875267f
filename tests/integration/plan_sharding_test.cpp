// `gpurun plan` counts cards (issue 29, item 5): the README's 7B gpt on 80 GB cards needs a few
// of them sharded, or one with its optimizer state offloaded to host memory; and the bad inputs
// of sharding and offload: distributed.shard with one rank is an info line, an offload the host
// cannot hold is exit 2 with the numbers.
#include <algorithm>
#include <string>
#include <vector>

#include <map>

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
    // With master weights one card holds 20 bytes a parameter (bf16 weights and gradients, an
    // fp32 gradient slice, Adam's moments and the master): no single 80 GB card holds it.
    EXPECT_EQ(c["fits"], "no") << c;
    EXPECT_EQ(c["placement"], "flat + master weights") << c;
    ASSERT_TRUE(c["cards_to_fit"].is_number_integer()) << c;
    // A count to rent that divides the batch of 8, with its time and, with a price, its cost.
    const int64_t n = c["cards_to_fit"].get<int64_t>();
    EXPECT_TRUE(n == 2 || n == 4 || n == 8) << c;
    EXPECT_LE(c["cards_to_fit_bytes"].get<int64_t>(), 72'000'000'000) << c;  // 10% headroom
    const nlohmann::json& to_fit = c["to_fit"];
    EXPECT_EQ(to_fit["cards"], n);
    EXPECT_TRUE(contains(to_fit["placement"].get<std::string>(), "master weights")) << c;
    ASSERT_TRUE(to_fit["step_seconds"].is_number()) << c;
    ASSERT_TRUE(to_fit["hours_to_finish"].is_number()) << c;
    EXPECT_EQ(to_fit["cost_to_finish"].is_number(), c["name"] == "eighty") << c;
    // The next size up, to compare: twice the cards, at most half the step (a rank that holds
    // more samples may drop activation checkpointing's recomputation).
    ASSERT_TRUE(c["next_size_up"].is_object()) << c;
    EXPECT_EQ(c["next_size_up"]["cards"], 2 * n) << c;
    EXPECT_LE(c["next_size_up"]["step_seconds"].get<double>(),
              to_fit["step_seconds"].get<double>() / 2 * (1 + 1e-9))
        << c;
    ASSERT_TRUE(c["offload"].is_object()) << c;
    EXPECT_TRUE(c["offload"]["fits"].is_boolean()) << c;
    // Adam's moments, the fp32 master and a gradient copy: 16 bytes a parameter.
    EXPECT_GT(c["offload"]["host_bytes"].get<int64_t>(), 16 * int64_t{6'000'000'000}) << c;
    EXPECT_TRUE(contains(c["note"].get<std::string>(), "on " + std::to_string(n) + " cards ("))
        << c;
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

// Issue 40, item 4: one placement decides both the plan's placement line and the card rows.
// The 7B with master weights under --memory-limit 141GB: the placement line says that one rank
// holds nothing, and the 141 GB card's row says one card does not hold it either (it said
// "with_plan, 1 card" at the replicated figure), and names the count that does.
TEST(PlanSharding, ThePlacementLineAndTheCardRowsAgree) {
  TempDir dir;
  const std::string config = write_config(dir, kGpt7B);
  const std::string cards = write_config(
      dir, "cards:\n  - {name: h200, memory: 141GB, bf16_tflops: 989, price_per_hour: 4}\n",
      "cards.yaml");
  const Result plan = run_gpurun(
      {"plan", config, "--cards", cards, "--estimate-only", "--memory-limit", "141GB", "--json"},
      {}, 180);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const nlohmann::json j = nlohmann::json::parse(plan.out);
  EXPECT_TRUE(contains(j["shard_reason"].get<std::string>(), "nothing fits")) << j["shard_reason"];
  const nlohmann::json& c = j["cards"][0];
  EXPECT_EQ(c["fits"], "no") << c;
  EXPECT_EQ(c["placement"], j["placement"]) << c;
  EXPECT_EQ(c["cards_to_fit"], 2) << c;
}

// Issue 40, item 4: without master weights no count of 80 GB cards up to 8 holds the 7B at a
// batch of 8; the plan names the levers that do, each with its count, time and cost.
TEST(PlanSharding, TheLeversThatFitAreNamedWithTheirCards) {
  TempDir dir;
  std::string text = kGpt7B;
  text.replace(text.find(", master_weights: true"), std::string(", master_weights: true").size(),
               "");
  const std::string config = write_config(dir, text);
  const std::string cards = write_config(
      dir, "cards:\n  - {name: eighty, memory: 80GB, bf16_tflops: 989, price_per_hour: 20}\n",
      "cards.yaml");
  const Result plan =
      run_gpurun({"plan", config, "--cards", cards, "--estimate-only", "--json"}, {}, 180);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const nlohmann::json c = nlohmann::json::parse(plan.out)["cards"][0];
  EXPECT_TRUE(c["cards_to_fit"].is_null() || c["cards_to_fit"].get<int64_t>() > 8) << c;
  std::map<std::string, nlohmann::json> levers;
  for (const auto& l : c["levers"]) levers[l["setting"].get<std::string>()] = l;
  ASSERT_TRUE(levers.count("optim.master_weights: true")) << c;
  const nlohmann::json& master = levers["optim.master_weights: true"];
  EXPECT_GE(master["cards"].get<int64_t>(), 2) << master;
  EXPECT_LE(master["cards"].get<int64_t>(), 8) << master;
  EXPECT_TRUE(master["cost_to_finish"].is_number()) << master;
  ASSERT_TRUE(levers.count("optim.master_weights: true and optim.offload: host")) << c;
  EXPECT_GT(
      levers["optim.master_weights: true and optim.offload: host"]["host_bytes"].get<int64_t>(), 0);
  bool lora = false;
  for (const auto& [setting, l] : levers) lora = lora || contains(setting, "model.lora.rank");
  EXPECT_TRUE(lora) << c;
  EXPECT_TRUE(contains(c["note"].get<std::string>(), "with optim.master_weights: true: ")) << c;
  // The table says it too.
  const Result text_plan =
      run_gpurun({"plan", config, "--cards", cards, "--estimate-only"}, {}, 180);
  EXPECT_TRUE(contains(text_plan.out, "with optim.master_weights: true: ")) << text_plan.out;
}

// Issue 40, item 4: a per-rank plan at --world-size 4 names the micro-batch of a rank; a world
// size that does not split the global batch is a configuration error (exit 2), not memory; and
// when nothing the settings allow fits, the placement that would is named with its settings.
TEST(PlanSharding, PerRankMicroBatchDivisibilityAndThePlacementThatWouldFit) {
  TempDir dir;
  const std::string config =
      write_config(dir,
                   "model: {name: mlp, hidden: [2048, 2048, 1024]}\n"
                   "data: {name: idx, train_samples: 640, eval_samples: 100}\n"
                   "optim: {name: adamw, lr: 0.001}\n"
                   "train: {epochs: 1, batch_size: 16, threads: 1}\n"
                   "memory: {probe_steps: 1}\n");
  const Result estimate =
      run_gpurun({"plan", config, "--world-size", "4", "--estimate-only"}, {}, 180);
  ASSERT_EQ(estimate.exit_code, 0) << estimate.err;
  EXPECT_TRUE(contains(estimate.out, "training step   micro-batch 4, a rank")) << estimate.out;

  const Result three = run_gpurun({"plan", config, "--world-size", "3"}, {}, 180);
  EXPECT_EQ(three.exit_code, 2) << three.err;
  EXPECT_TRUE(contains(three.err, "--world-size 3: train.batch_size 16 must be divisible"))
      << three.err;
  EXPECT_TRUE(contains(three.err, "the world sizes that divide it: 1, 2, 4, 8, 16")) << three.err;
  EXPECT_FALSE(contains(three.err, "does not fit")) << three.err;

  // 90 MiB usable: replicated 153, optimizer 121, gradients 90.3 MiB a rank; gradients with
  // offload 75 MiB: named, with the settings that give it.
  const Result tight =
      run_gpurun({"plan", config, "--world-size", "4", "--memory-limit", "100MiB", "--json"},
                 {{"GPURUN_HOST_MEMORY", "4GiB"}}, 180);
  ASSERT_EQ(tight.exit_code, 0) << tight.err;
  const std::string reason = nlohmann::json::parse(tight.out)["shard_reason"];
  EXPECT_TRUE(contains(reason, "nothing fits")) << reason;
  EXPECT_TRUE(contains(reason, "gradients + offload would fit")) << reason;
  EXPECT_TRUE(contains(reason, "set distributed.shard: gradients and optim.offload: host"))
      << reason;
}

}  // namespace
}  // namespace gpurun::test

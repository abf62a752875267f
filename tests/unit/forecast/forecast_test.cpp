// The card forecast's arithmetic (forecast/forecast.h) and the cards file (forecast/cards.h).
#include "forecast/forecast.h"

#include <gtest/gtest.h>

#include "forecast/cards.h"
#include "gpurun/errors.h"

namespace gpurun {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

/// 4 GiB of state, 1 GiB a sample; 1 PFLOP a step; 1000 steps of 100 an epoch; no headroom.
Workload workload() {
  Workload w;
  w.plain = {4.0 * kGiB, 1.0 * kGiB};
  w.checkpointed = MemoryLine{4.0 * kGiB, 0.25 * kGiB};
  w.eval = {4.0 * kGiB, 0.1 * kGiB};
  w.state_bytes = 4 * kGiB;
  w.global_batch = 16;
  w.micro_batch = 16;
  w.eval_batch = 16;
  w.precision = "bf16";
  w.flops_per_step = 1e15;
  w.flops_per_step_checkpointed = 4e15 / 3;
  w.optimizer_steps = 1000;
  w.steps_per_epoch = 100;
  w.headroom = 0;
  return w;
}

Card card(double gib, double bf16 = 100, std::optional<double> price = 2.0) {
  return {"card", static_cast<int64_t>(gib * kGiB), bf16, std::nullopt, price};
}

TEST(Forecast, FitsAsConfiguredThenWithAccumulationThenWithCheckpointingThenNot) {
  const Workload w = workload();
  EXPECT_EQ(forecast(card(20), w, 72).fits, "as_configured");  // 4 + 16 x 1 = 20 GiB
  const CardForecast acc = forecast(card(12.5), w, 72);        // 4 + 8 = 12 fits
  EXPECT_EQ(acc.fits, "with_plan");
  EXPECT_EQ(acc.micro_batch, 8);
  EXPECT_EQ(acc.accumulation, 2);
  EXPECT_FALSE(acc.activation_checkpointing);
  const CardForecast ck = forecast(card(5.5), w, 72);  // 4 + 1 > 5.5 > 4 + 4 x 0.25 = 5
  EXPECT_EQ(ck.fits, "with_plan");
  EXPECT_EQ(ck.micro_batch, 4);
  EXPECT_TRUE(ck.activation_checkpointing);
  const CardForecast no = forecast(card(3), w, 72);  // the state alone is 4 GiB
  EXPECT_EQ(no.fits, "no");
  EXPECT_FALSE(no.hours_to_finish);
  EXPECT_NE(no.plan.find("distributed.shard cuts the optimizer state per card"), std::string::npos)
      << no.plan;
}

// A micro-batch of 1 that fits only with activation checkpointing (the 7B gpt on an H200) was
// reported as not fitting: no smaller micro-batch exists to try checkpointing at.
TEST(Forecast, MicroBatchOneFitsWithActivationCheckpointing) {
  Workload w = workload();
  w.global_batch = w.micro_batch = 1;
  const CardForecast f = forecast(card(4.5), w, 72);  // 4 + 1 > 4.5 >= 4 + 0.25
  EXPECT_EQ(f.fits, "with_plan");
  EXPECT_EQ(f.micro_batch, 1);
  EXPECT_TRUE(f.activation_checkpointing);
}

// Issue 29, item 5: the fewest cards that hold the run sharded, and one card with offload.
TEST(Forecast, CardsToFitCountsShardedCardsAndOneCardWithOffloadNamesTheHost) {
  Workload w = workload();
  // Without a per-rank model: nothing is said.
  CardForecast f = forecast(card(3), w, 72);
  EXPECT_FALSE(f.cards_to_fit);
  EXPECT_FALSE(f.offload);
  EXPECT_TRUE(f.to_json(card(3))["cards_to_fit"].is_null());
  // A rank of n cards needs 2 GiB + 8 GiB / n (weights and the state's share); one card with
  // offload 3 GiB on the card and 7 GiB of host memory.
  w.sharded = [](int64_t n, bool offload) {
    return offload ? Workload::RankNeed{3 * kGiB, 7 * kGiB}
                   : Workload::RankNeed{2 * kGiB + 8 * kGiB / n, 0};
  };
  f = forecast(card(3), w, 72);  // 2 + 8/n <= 3: n >= 8
  EXPECT_EQ(f.fits, "no");
  ASSERT_TRUE(f.cards_to_fit);
  EXPECT_EQ(*f.cards_to_fit, 8);
  EXPECT_EQ(f.cards_to_fit_bytes, 3 * kGiB);
  ASSERT_TRUE(f.offload);
  EXPECT_TRUE(f.offload->fits);
  EXPECT_EQ(f.offload->host_bytes, 7 * kGiB);
  EXPECT_NE(f.note.find("sharded over 8 cards it fits"), std::string::npos) << f.note;
  EXPECT_NE(f.note.find("one card holds it with optim.offload: host"), std::string::npos) << f.note;
  const nlohmann::json j = f.to_json(card(3));
  EXPECT_EQ(j["cards_to_fit"], 8);
  EXPECT_EQ(j["offload"]["fits"], true);
  EXPECT_EQ(j["offload"]["host_bytes"], 7 * kGiB);
  // 2 + 8/n > 2.1 for every n up to 64 (2.125 at 64): null; offload does not fit either.
  f = forecast(card(2.1), w, 72);
  EXPECT_FALSE(f.cards_to_fit);
  EXPECT_TRUE(f.to_json(card(2.1))["cards_to_fit"].is_null());
  EXPECT_FALSE(f.offload->fits);
  EXPECT_NE(f.note.find("no count of cards up to 64"), std::string::npos) << f.note;
  // A global batch the count does not divide is said.
  w.global_batch = 12;
  w.micro_batch = 12;
  f = forecast(card(3), w, 72);
  EXPECT_NE(f.note.find("train.batch_size 12 must be a multiple of 8"), std::string::npos)
      << f.note;
  // One card holds it as it is: 1.
  EXPECT_EQ(*forecast(card(20), w, 72).cards_to_fit, 1);
}

TEST(Forecast, TimeCostLostWorkAndCardsForADeadline) {
  Workload w = workload();
  // 1e15 FLOPs at 40% of 100 TFLOP/s: 25 s a step; 1000 steps: 25000 s.
  const CardForecast f = forecast(card(20), w, 72);
  EXPECT_DOUBLE_EQ(*f.predicted_step_seconds, 1e15 / (100e12 * kAssumedUtilisation));
  EXPECT_DOUBLE_EQ(*f.hours_to_finish, 25000.0 / 3600.0);
  EXPECT_DOUBLE_EQ(*f.cost_to_finish, 2.0 * 25000.0 / 3600.0);
  EXPECT_DOUBLE_EQ(*f.lost_hours_per_reclaim, 100 * 25.0 / 3600.0);  // an epoch
  EXPECT_DOUBLE_EQ(*f.lost_cost_per_reclaim, 2.0 * 100 * 25.0 / 3600.0);
  EXPECT_FALSE(f.cards_for_deadline);
  w.checkpoint_every_seconds = 600;  // every_minutes 10 is sooner than an epoch
  EXPECT_DOUBLE_EQ(*forecast(card(20), w, 72).lost_hours_per_reclaim, 600.0 / 3600.0);
  // 6.94 h against a 2 h deadline: 4 cards (ceil 3.47), which divide the global batch 16.
  EXPECT_EQ(forecast(card(20), w, 2).cards_for_deadline, 4);
  // 5 cards would do for 1.5 h, but 5 does not divide 16: 8.
  EXPECT_EQ(forecast(card(20), w, 1.5).cards_for_deadline, 8);
  EXPECT_FALSE(forecast(card(20), w, 0.01).cards_for_deadline);  // more than 16 cards
  // No price: no cost. An fp32 run on a card without fp32_tflops: no time.
  EXPECT_FALSE(forecast(card(20, 100, std::nullopt), w, 72).cost_to_finish);
  EXPECT_FALSE(forecast(card(20, 100, std::nullopt), w, 72).lost_cost_per_reclaim);
  EXPECT_TRUE(forecast(card(20, 100, std::nullopt), w, 72).lost_hours_per_reclaim);
  w.precision = "fp32";
  EXPECT_FALSE(forecast(card(20), w, 72).predicted_step_seconds);
}

TEST(Cards, TheBundledTableParsesAndAUsersFileIsChecked) {
  EXPECT_GE(bundled_cards().size(), 5u);
  for (const Card& c : bundled_cards()) {
    EXPECT_GT(c.memory_bytes, 0) << c.name;
    EXPECT_GT(c.bf16_tflops, 0) << c.name;
  }
  const auto cards = parse_cards(
      "cards:\n  - {name: a, memory: 24GiB, bf16_tflops: 165, fp32_tflops: 83, "
      "price_per_hour: 3}\n  - {name: b, memory: 80GB, bf16_tflops: 312}\n",
      "t.yaml");
  ASSERT_EQ(cards.size(), 2u);
  EXPECT_EQ(cards[0].memory_bytes, 24 * kGiB);
  EXPECT_EQ(*cards[0].fp32_tflops, 83);
  EXPECT_EQ(*cards[0].price_per_hour, 3);
  EXPECT_EQ(cards[1].memory_bytes, 80'000'000'000);
  EXPECT_FALSE(cards[1].price_per_hour);
  auto error = [](const std::string& yaml) {
    try {
      parse_cards(yaml, "t.yaml");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("cards:\n  - {name: a, memory: 1GiB, bf16_tflop: 1}\n")
                .find("unknown key bf16_tflop; did you mean bf16_tflops?"),
            std::string::npos);
  EXPECT_NE(error("cards:\n  - {name: a, memory: lots, bf16_tflops: 1}\n").find("memory"),
            std::string::npos);
  EXPECT_NE(error("cards:\n  - {name: a, memory: 1GiB, bf16_tflops: -1}\n").find("> 0"),
            std::string::npos);
  EXPECT_NE(error("cards: []\n").find("at least one"), std::string::npos);
  EXPECT_NE(error("cards:\n  - {name: a, memory: 1GiB, bf16_tflops: 1}\n"
                  "  - {name: a, memory: 1GiB, bf16_tflops: 1}\n")
                .find("twice"),
            std::string::npos);
  EXPECT_NE(error("gpus: []\n").find("cards"), std::string::npos);
  // Issue 31, item 8: yaml-cpp kept the first of two equal keys without a word.
  EXPECT_NE(error("cards:\n  - {name: a, memory: 24GB, memory: 48GB, bf16_tflops: 1}\n")
                .find("t.yaml: card 1: key memory is given twice (line 2)"),
            std::string::npos)
      << error("cards:\n  - {name: a, memory: 24GB, memory: 48GB, bf16_tflops: 1}\n");
}

// One card table: the planner's messages name the smallest card of the same table the
// forecast uses (it had a second, hard-coded one).
TEST(Cards, TheSmallestCardThatHoldsANeedWithTheHeadroom) {
  const auto cards = parse_cards(
      "cards:\n  - {name: big, memory: 80GiB, bf16_tflops: 1}\n"
      "  - {name: small, memory: 24GiB, bf16_tflops: 1}\n"
      "  - {name: small-too, memory: 24GiB, bf16_tflops: 2}\n",
      "t.yaml");
  EXPECT_EQ(smallest_card_for(cards, 20 * kGiB, 0.1), "small (24.00 GiB)");
  EXPECT_EQ(smallest_card_for(cards, 22 * kGiB, 0.1), "big (80.00 GiB)");  // 21.6 usable
  EXPECT_EQ(smallest_card_for(cards, 22 * kGiB, 0.0), "small (24.00 GiB)");
  EXPECT_EQ(smallest_card_for(cards, 500 * kGiB, 0.1), "");
  EXPECT_EQ(smallest_card_for(bundled_cards(), 20 * kGiB, 0.1), "NVIDIA L4 (22.35 GiB)");
}

}  // namespace
}  // namespace gpurun

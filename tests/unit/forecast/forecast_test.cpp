// The card forecast's arithmetic (forecast/forecast.h) and the cards file (forecast/cards.h).
#include "forecast/forecast.h"

#include <gtest/gtest.h>

#include "forecast/cards.h"
#include "gpurun/errors.h"

namespace gpurun {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

/// One rank of n cards: 2 GiB of weights and 2 GiB / n of optimizer state (a sharded run's),
/// 1 GiB a sample (0.25 checkpointed, 0.1 evaluated); 1 PFLOP a step; 1000 steps of 100 an
/// epoch; no headroom. On one card 4 GiB of state, as a replicated run's.
RankLinesOn ranks(double weights = 2, double state = 2, double host = 0) {
  return [=](int64_t n, int64_t) {
    const double fixed = (weights + state / static_cast<double>(n)) * kGiB;
    RankLines r;
    r.plain = {fixed, 1.0 * kGiB, 0};
    r.checkpointed = MemoryLine{fixed, 0.25 * kGiB, 0};
    r.eval = {fixed, 0.1 * kGiB, 0};
    r.state_bytes = static_cast<int64_t>(fixed);
    r.host_bytes = static_cast<int64_t>(host * kGiB);
    r.placement = n == 1 ? "replicated" : "optimizer";
    return r;
  };
}

Workload workload() {
  Workload w;
  w.ranks = ranks();
  w.global_batch = 16;
  w.accumulation = 1;
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
  const CardForecast no = forecast(card(3.2), w, 72);  // the state alone is 4 GiB on one card
  EXPECT_EQ(no.fits, "no");
  EXPECT_FALSE(no.hours_to_finish);
  EXPECT_NE(no.plan.find("checkpoint capture or resume loading needs 4.00 GiB"), std::string::npos)
      << no.plan;
}

// A micro-batch of 1 that fits only with activation checkpointing (the 7B gpt on an H200) was
// reported as not fitting: no smaller micro-batch exists to try checkpointing at.
TEST(Forecast, MicroBatchOneFitsWithActivationCheckpointing) {
  Workload w = workload();
  w.global_batch = 1;
  const CardForecast f = forecast(card(4.5), w, 72);  // 4 + 1 > 4.5 >= 4 + 0.25
  EXPECT_EQ(f.fits, "with_plan");
  EXPECT_EQ(f.micro_batch, 1);
  EXPECT_TRUE(f.activation_checkpointing);
}

// The optimizer's update (the floor of a line) is what a small micro-batch cannot go under.
TEST(Forecast, TheUpdatesPartIsAFloorNoMicroBatchGoesUnder) {
  Workload w = workload();
  w.ranks = [](int64_t, int64_t) {
    RankLines r;
    r.plain = {4.0 * kGiB, 1.0 * kGiB, 7.0 * kGiB};  // the update needs 7 GiB
    r.eval = {4.0 * kGiB, 0, 0};
    r.state_bytes = 4 * kGiB;
    return r;
  };
  EXPECT_EQ(forecast(card(6.5), w, 72).fits, "no");  // micro-batch 2 would be 6 GiB, but 7
  const CardForecast f = forecast(card(7.5), w, 72);
  EXPECT_EQ(f.fits, "with_plan");
  EXPECT_EQ(f.micro_batch, 2);  // 4 + 2 = 6 < 7: the floor
  EXPECT_EQ(f.predicted_peak_bytes, 7 * kGiB);
}

// Issue 40, item 4: the cards to rent are 1, 2, 4 or 8 on a box (then boxes of 8) dividing
// the global batch, each with its time and cost; the next size up beside it to compare.
TEST(Forecast, CardsToFitIsACountToRentWithItsTimeAndCostAndTheNextSizeUp) {
  Workload w = workload();
  // 2 + 2/n + 0.25 (checkpointed, micro-batch 1) <= 2.6: n = 8 (2.5); 6 would do (2.58), but
  // 6 is not a count to rent.
  CardForecast f = forecast(card(2.6), w, 72);
  EXPECT_EQ(f.fits, "no");
  ASSERT_TRUE(f.to_fit);
  EXPECT_EQ(f.to_fit->cards, 8);
  EXPECT_EQ(f.to_fit->placement, "optimizer");
  EXPECT_TRUE(f.to_fit->batch_divides);
  EXPECT_EQ(f.to_fit->micro_batch, 1);  // 16 / 8 = 2 a rank; 2.75 GiB at 2 does not fit
  EXPECT_TRUE(f.to_fit->activation_checkpointing);
  // 8 cards share the step: 1e15 x 4/3 (recomputation) at 40% of 8 x 100 TFLOP/s.
  const double step = 4e15 / 3 / (8 * 100e12 * kAssumedUtilisation);
  EXPECT_DOUBLE_EQ(*f.to_fit->step_seconds, step);
  EXPECT_DOUBLE_EQ(*f.to_fit->hours_to_finish, step * 1000 / 3600);
  EXPECT_DOUBLE_EQ(*f.to_fit->cost_to_finish, step * 1000 / 3600 * 2.0 * 8);
  ASSERT_TRUE(f.next_size_up);
  EXPECT_EQ(f.next_size_up->cards, 16);
  EXPECT_DOUBLE_EQ(*f.next_size_up->step_seconds, 4e15 / 3 / (16 * 100e12 * kAssumedUtilisation));
  EXPECT_NE(f.note.find("on 8 cards (optimizer"), std::string::npos) << f.note;
  nlohmann::json j = f.to_json(card(2.6));
  EXPECT_EQ(j["cards_to_fit"], 8);
  EXPECT_EQ(j["to_fit"]["cards"], 8);
  EXPECT_EQ(j["next_size_up"]["cards"], 16);
  EXPECT_TRUE(j["to_fit"]["cost_to_finish"].is_number());
  // One card that holds it: to_fit is 1 and the next size up is 2.
  f = forecast(card(20), w, 72);
  EXPECT_EQ(f.to_fit->cards, 1);
  EXPECT_EQ(f.next_size_up->cards, 2);
  // A batch of 12: 8 does not divide it, 4 does not fit (2.75); the smallest count that divides
  // it and fits is 6 (2 + 2/6 + 0.25 = 2.58).
  w.global_batch = 12;
  f = forecast(card(2.6), w, 72);
  EXPECT_EQ(f.to_fit->cards, 6);
  EXPECT_TRUE(f.to_fit->batch_divides);
  // A batch of 1: no count above 1 divides it; the smallest count to rent that fits is
  // reported, and the note says the batch must change.
  w.global_batch = 1;
  f = forecast(card(2.6), w, 72);
  EXPECT_EQ(f.to_fit->cards, 8);
  EXPECT_FALSE(f.to_fit->batch_divides);
  EXPECT_NE(f.note.find("train.batch_size 1 must be a multiple of 8"), std::string::npos) << f.note;
  // 2 + 2/n + 0.25 > 2.2 for every n up to 64: none.
  f = forecast(card(2.2), workload(), 72);
  EXPECT_FALSE(f.to_fit);
  EXPECT_TRUE(f.to_json(card(2.2))["cards_to_fit"].is_null());
  EXPECT_NE(f.note.find("no count of cards up to 64"), std::string::npos) << f.note;
}

// Issue 40, item 4: where the run takes more cards (or none holds it), the levers that take
// fewer are named with their counts; one card with offload says what the host holds.
TEST(Forecast, LeversThatFitInFewerCardsAreNamedWithTheirNumbers) {
  Workload w = workload();
  w.levers.push_back({"optim.master_weights: true", ranks(1, 2)});  // 1 + 2/n + 0.25
  w.levers.push_back({"model.lora.rank: 16", ranks(2.5, 0)});       // never under 2.75
  w.offloaded = ranks(2, 0, 2);                                     // 2 + 0.25 a card
  CardForecast f = forecast(card(2.6), w, 72);
  ASSERT_EQ(f.to_fit->cards, 8);
  ASSERT_EQ(f.levers.size(), 1u);
  EXPECT_EQ(f.levers[0].first, "optim.master_weights: true");
  EXPECT_EQ(f.levers[0].second.cards, 2);  // 1 + 2/2 + 0.25 = 2.25 (one card: 3.25)
  ASSERT_TRUE(f.offload);
  EXPECT_TRUE(f.offload->fits);
  EXPECT_EQ(f.offload->host_bytes, 2 * kGiB);
  EXPECT_NE(f.note.find("with optim.master_weights: true:"), std::string::npos) << f.note;
  const nlohmann::json j = f.to_json(card(2.6));
  ASSERT_EQ(j["levers"].size(), 1u);
  EXPECT_EQ(j["levers"][0]["setting"], "optim.master_weights: true");
  // A card that holds the run as it is suggests nothing.
  EXPECT_TRUE(forecast(card(20), w, 72).levers.empty());
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

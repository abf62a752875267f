#include "forecast/forecast.h"

#include <algorithm>
#include <cmath>

#include "memory/planner.h"
#include "util/units.h"

namespace gpurun {
namespace {

nlohmann::json or_null(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

/// Fits the memory part: as configured, with accumulation, with activation checkpointing and
/// accumulation, or not; the eval batch halved as the planner halves it.
void fit(CardForecast& f, const Card& card, const Workload& w) {
  const double usable = static_cast<double>(card.memory_bytes) * (1.0 - w.headroom);
  f.fits = "no";
  if (static_cast<double>(w.state_bytes) > usable) {
    f.plan = "checkpoint capture or resume loading needs " + format_bytes(w.state_bytes) +
             " (weights, gradients and optimizer state), which no micro-batch changes; DDP "
             "replicates them on every card, distributed.shard cuts the optimizer state per "
             "card";
    f.predicted_peak_bytes = w.state_bytes;
    return;
  }
  int64_t b = w.eval_batch;
  while (b > 1 && w.eval.at(b) > usable) b = std::max<int64_t>(1, b / 2);
  if (w.eval.at(b) > usable) {
    f.plan =
        "evaluation needs " + format_bytes(static_cast<int64_t>(w.eval.at(b))) + " at eval batch 1";
    f.predicted_peak_bytes = static_cast<int64_t>(w.eval.at(b));
    return;
  }
  f.eval_batch = b;
  const double others = std::max(static_cast<double>(w.state_bytes), w.eval.at(b));
  auto take = [&](const char* fits, int64_t micro, bool checkpointing, double peak) {
    f.fits = fits;
    f.micro_batch = micro;
    f.accumulation = w.global_batch / micro;
    f.activation_checkpointing = checkpointing;
    f.predicted_peak_bytes = static_cast<int64_t>(std::max(peak, others));
    f.plan = "micro-batch " + std::to_string(micro) + " x accumulation " +
             std::to_string(f.accumulation) + (checkpointing ? ", activation checkpointing" : "") +
             ", " + w.precision + (b == w.eval_batch ? "" : ", eval batch " + std::to_string(b));
  };
  if (w.plain.at(w.micro_batch) <= usable)
    return take("as_configured", w.micro_batch, false, w.plain.at(w.micro_batch));
  for (int64_t d : divisors_descending(w.global_batch)) {
    if (d >= w.micro_batch) continue;
    if (w.plain.at(d) <= usable) return take("with_plan", d, false, w.plain.at(d));
    if (w.checkpointed && w.checkpointed->at(d) <= usable)
      return take("with_plan", d, true, w.checkpointed->at(d));
  }
  // The configured micro-batch with activation checkpointing (the only option at micro-batch 1).
  if (w.checkpointed && w.checkpointed->at(w.micro_batch) <= usable)
    return take("with_plan", w.micro_batch, true, w.checkpointed->at(w.micro_batch));
  f.predicted_peak_bytes =
      static_cast<int64_t>(w.checkpointed ? w.checkpointed->at(1) : w.plain.at(1));
  f.plan = "micro-batch 1" + std::string(w.checkpointed ? " with activation checkpointing" : "") +
           " needs " + format_bytes(f.predicted_peak_bytes) +
           "; DDP replicates the model on every card and does not cut this; distributed.shard "
           "cuts the optimizer state (and the master weights) per card, not the weights";
}

/// cards_to_fit and the one card with offload, from the per-rank needs.
void fit_sharded(CardForecast& f, const Card& card, const Workload& w) {
  if (!w.sharded) return;
  const double usable = static_cast<double>(card.memory_bytes) * (1.0 - w.headroom);
  if (f.fits != "no") {
    f.cards_to_fit = 1;
    f.cards_to_fit_bytes = f.predicted_peak_bytes;
  } else {
    for (int64_t n = 2; n <= kMaxCardsToFit; ++n) {
      const Workload::RankNeed need = w.sharded(n, false);
      if (static_cast<double>(need.card_bytes) > usable) continue;
      f.cards_to_fit = n;
      f.cards_to_fit_bytes = need.card_bytes;
      break;
    }
  }
  const Workload::RankNeed one = w.sharded(1, true);
  f.offload = CardForecast::Offload{static_cast<double>(one.card_bytes) <= usable, one.card_bytes,
                                    one.host_bytes};
  if (f.fits != "no") return;
  std::string say;
  if (f.cards_to_fit) {
    say = "sharded over " + std::to_string(*f.cards_to_fit) + " cards it fits (" +
          format_bytes(f.cards_to_fit_bytes) + " a card at micro-batch 1" +
          (w.global_batch % *f.cards_to_fit == 0
               ? ""
               : "; train.batch_size " + std::to_string(w.global_batch) +
                     " must be a multiple of " + std::to_string(*f.cards_to_fit)) +
          ")";
  } else {
    say = "no count of cards up to " + std::to_string(kMaxCardsToFit) + " holds it sharded";
  }
  if (f.offload->fits)
    say += "; one card holds it with optim.offload: host (" + format_bytes(one.card_bytes) +
           " on the card, " + format_bytes(one.host_bytes) + " of host memory)";
  f.note = f.note.empty() ? say : f.note + "; " + say;
}

}  // namespace

CardForecast forecast(const Card& card, const Workload& w, double deadline_hours) {
  CardForecast f;
  fit(f, card, w);
  fit_sharded(f, card, w);
  if (f.fits == "no") return f;
  const bool low = w.precision != "fp32";
  const std::optional<double> tflops =
      low ? std::optional<double>(card.bf16_tflops) : card.fp32_tflops;
  if (!tflops) {
    f.note = "no fp32_tflops for this card: the time is not predicted";
    return f;
  }
  const double flops =
      f.activation_checkpointing ? w.flops_per_step_checkpointed : w.flops_per_step;
  if (flops <= 0) {
    f.note = "the model's FLOPs are not known: the time is not predicted";
    return f;
  }
  const double step = flops / (*tflops * 1e12 * kAssumedUtilisation);
  f.predicted_step_seconds = step;
  const double hours = step * static_cast<double>(w.optimizer_steps) / 3600.0;
  f.hours_to_finish = hours;
  if (card.price_per_hour) f.cost_to_finish = hours * *card.price_per_hour;
  double interval = static_cast<double>(std::max<int64_t>(1, w.steps_per_epoch)) * step;
  if (w.checkpoint_every_seconds > 0) interval = std::min(interval, w.checkpoint_every_seconds);
  if (w.checkpoint_every_steps > 0)
    interval = std::min(interval, static_cast<double>(w.checkpoint_every_steps) * step);
  f.lost_hours_per_reclaim = std::min(interval / 3600.0, hours);
  if (card.price_per_hour)
    f.lost_cost_per_reclaim = *f.lost_hours_per_reclaim * *card.price_per_hour;
  if (hours > deadline_hours) {
    const int64_t need = static_cast<int64_t>(std::ceil(hours / deadline_hours));
    // Each rank takes global / n samples a step (a micro-batch no larger than this card's).
    for (int64_t n = need; n <= w.global_batch; ++n) {
      if (w.global_batch % n != 0) continue;
      f.cards_for_deadline = n;
      break;
    }
    f.note = f.cards_for_deadline
                 ? "DDP on " + std::to_string(*f.cards_for_deadline) +
                       " cards, assuming linear scaling; each card holds the whole model"
                 : "the deadline needs " + std::to_string(need) +
                       " cards, more than the global batch of " + std::to_string(w.global_batch) +
                       " samples has";
  }
  return f;
}

nlohmann::json CardForecast::to_json(const Card& card) const {
  nlohmann::json j = {
      {"name", card.name},
      {"card", card.name},
      {"memory_bytes", card.memory_bytes},
      {"capacity_bytes", card.memory_bytes},
      {"fits", fits},
      {"plan", plan},
      {"predicted_peak_bytes", predicted_peak_bytes},
      {"predicted_step_seconds", or_null(predicted_step_seconds)},
      {"hours_to_finish", or_null(hours_to_finish)},
      {"cost_to_finish", or_null(cost_to_finish)},
      {"lost_hours_per_reclaim", or_null(lost_hours_per_reclaim)},
      {"lost_cost_per_reclaim", or_null(lost_cost_per_reclaim)},
      {"cards_for_deadline",
       cards_for_deadline ? nlohmann::json(*cards_for_deadline) : nlohmann::json()},
      {"note", note},
      {"cards_to_fit", cards_to_fit ? nlohmann::json(*cards_to_fit) : nlohmann::json()},
      {"cards_to_fit_bytes", cards_to_fit ? nlohmann::json(cards_to_fit_bytes) : nlohmann::json()},
      {"offload", offload ? nlohmann::json{{"fits", offload->fits},
                                           {"card_bytes", offload->card_bytes},
                                           {"host_bytes", offload->host_bytes}}
                          : nlohmann::json()}};
  if (fits != "no") {
    j["micro_batch"] = micro_batch;
    j["accumulation_steps"] = accumulation;
    j["activation_checkpointing"] = activation_checkpointing;
    j["eval_batch"] = eval_batch;
  }
  return j;
}

}  // namespace gpurun

#include "forecast/forecast.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "memory/planner.h"
#include "util/units.h"

namespace gpurun {
namespace {

nlohmann::json or_null(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

double usable_bytes_of(const Card& card, const Workload& w) {
  return static_cast<double>(card.memory_bytes) * (1.0 - w.headroom);
}

/// The throughput a step runs at on `card` (TFLOP/s), by the run's precision; none: unknown.
std::optional<double> tflops_of(const Card& card, const Workload& w) {
  return w.precision != "fp32" ? std::optional<double>(card.bf16_tflops) : card.fp32_tflops;
}

/// The memory part of `o` (its fields but the time): on o.cards cards, each rank takes
/// global / cards samples a step; as configured, with accumulation, with activation
/// checkpointing and accumulation, or not; the eval batch halved as the planner halves it.
void fit_memory(CardOption& o, const Card& card, const Workload& w, const RankLines& r) {
  const double usable = usable_bytes_of(card, w);
  const int64_t n = o.cards;
  o.fits = "no";
  o.placement = r.placement;
  o.host_bytes = r.host_bytes;
  o.batch_divides = w.global_batch % n == 0;
  const std::string a_card = n == 1 ? "" : " a card";
  if (static_cast<double>(r.state_bytes) > usable) {
    o.plan = "checkpoint capture or resume loading needs " + format_bytes(r.state_bytes) + a_card +
             " (weights, gradients and optimizer state), which no micro-batch changes";
    o.peak_bytes = r.state_bytes;
    return;
  }
  int64_t b = w.eval_batch;
  while (b > 1 && r.eval.at(b) > usable) b = std::max<int64_t>(1, b / 2);
  if (r.eval.at(b) > usable) {
    o.peak_bytes = static_cast<int64_t>(r.eval.at(b));
    o.plan = "evaluation needs " + format_bytes(o.peak_bytes) + a_card + " at eval batch 1";
    return;
  }
  o.eval_batch = b;
  const double others = std::max(static_cast<double>(r.state_bytes), r.eval.at(b));
  const int64_t per_rank = std::max<int64_t>(1, w.global_batch / n);
  const int64_t configured = std::max<int64_t>(1, w.global_batch / w.accumulation / n);
  auto take = [&](const char* fits, int64_t micro, bool checkpointing, double peak) {
    o.fits = fits;
    o.micro_batch = micro;
    o.accumulation = std::max<int64_t>(1, per_rank / micro);
    o.activation_checkpointing = checkpointing;
    o.peak_bytes = static_cast<int64_t>(std::max(peak, others));
    o.plan = "micro-batch " + std::to_string(micro) + " x accumulation " +
             std::to_string(o.accumulation) + (n > 1 ? " a rank" : "") +
             (checkpointing ? ", activation checkpointing" : "") + ", " + w.precision +
             (b == w.eval_batch ? "" : ", eval batch " + std::to_string(b));
  };
  if (r.plain.at(configured) <= usable)
    return take("as_configured", configured, false, r.plain.at(configured));
  for (int64_t d : divisors_descending(per_rank)) {
    if (d >= configured) continue;
    if (r.plain.at(d) <= usable) return take("with_plan", d, false, r.plain.at(d));
    if (r.checkpointed && r.checkpointed->at(d) <= usable)
      return take("with_plan", d, true, r.checkpointed->at(d));
  }
  // The configured micro-batch with activation checkpointing (the only option at micro-batch 1).
  if (r.checkpointed && r.checkpointed->at(configured) <= usable)
    return take("with_plan", configured, true, r.checkpointed->at(configured));
  o.peak_bytes = static_cast<int64_t>(r.checkpointed ? r.checkpointed->at(1) : r.plain.at(1));
  o.plan = "micro-batch 1" + std::string(r.checkpointed ? " with activation checkpointing" : "") +
           " needs " + format_bytes(o.peak_bytes) + a_card;
}

/// The run on `n` cards of `card` through `ranks`: its plan, and where it fits, its time and
/// cost (linear scaling: every card computes its share of the global batch).
CardOption option_on(const Card& card, const Workload& w, const RankLinesOn& ranks, int64_t n) {
  CardOption o;
  o.cards = n;
  fit_memory(o, card, w, ranks(n, card.memory_bytes));
  const std::optional<double> tflops = tflops_of(card, w);
  if (o.fits == "no" || !tflops) return o;
  const double flops =
      o.activation_checkpointing ? w.flops_per_step_checkpointed : w.flops_per_step;
  if (flops <= 0) return o;
  o.step_seconds = flops / (static_cast<double>(n) * *tflops * 1e12 * kAssumedUtilisation);
  o.hours_to_finish = *o.step_seconds * static_cast<double>(w.optimizer_steps) / 3600.0;
  if (card.price_per_hour)
    o.cost_to_finish = *o.hours_to_finish * *card.price_per_hour * static_cast<double>(n);
  return o;
}

bool rentable(int64_t n) {
  const std::vector<int64_t> counts = rentable_card_counts();
  return std::find(counts.begin(), counts.end(), n) != counts.end();
}

/// The fewest cards to rent that hold the run through `ranks`, above `after` cards: the
/// rentable counts that divide the global batch, else the smallest count that divides it,
/// else the smallest rentable count (whose batch_divides is false).
std::optional<CardOption> cards_that_fit(const Card& card, const Workload& w,
                                         const RankLinesOn& ranks, int64_t after = 0) {
  const auto first = [&](const std::vector<int64_t>& counts,
                         bool divides) -> std::optional<CardOption> {
    for (const int64_t n : counts) {
      if (n <= after || (w.global_batch % n == 0) != divides) continue;
      CardOption o = option_on(card, w, ranks, n);
      if (o.fits != "no") return o;
    }
    return std::nullopt;
  };
  if (auto o = first(rentable_card_counts(), true)) return o;
  std::vector<int64_t> others;
  for (int64_t n = 1; n <= kMaxCardsToFit; ++n)
    if (!rentable(n)) others.push_back(n);
  if (auto o = first(others, true)) return o;
  return first(rentable_card_counts(), false);
}

/// "2 cards: optimizer + master weights, 71.0 GB a card, 1.20 s a step, 3h12m, 64.00" for
/// the notes.
std::string option_text(const CardOption& o) {
  std::string s = std::to_string(o.cards) + (o.cards == 1 ? " card" : " cards") + " (" +
                  o.placement + ", " + format_bytes(o.peak_bytes) + (o.cards == 1 ? "" : " a card");
  if (o.host_bytes > 0) s += ", " + format_bytes(o.host_bytes) + " of host memory a card";
  if (o.hours_to_finish) s += ", " + format_duration(3600.0 * *o.hours_to_finish);
  if (o.cost_to_finish) {
    char b[32];
    std::snprintf(b, sizeof b, ", cost %.2f", *o.cost_to_finish);
    s += b;
  }
  return s + ")";
}

void append(std::string& note, const std::string& s) { note = note.empty() ? s : note + "; " + s; }

}  // namespace

std::vector<int64_t> rentable_card_counts() {
  std::vector<int64_t> counts{1, 2, 4, 8};
  for (int64_t n = 16; n <= kMaxCardsToFit; n += 8) counts.push_back(n);
  return counts;
}

nlohmann::json CardOption::to_json() const {
  nlohmann::json j = {{"cards", cards},
                      {"fits", fits},
                      {"plan", plan},
                      {"placement", placement},
                      {"peak_bytes", peak_bytes},
                      {"host_bytes", host_bytes},
                      {"batch_divides", batch_divides},
                      {"step_seconds", or_null(step_seconds)},
                      {"hours_to_finish", or_null(hours_to_finish)},
                      {"cost_to_finish", or_null(cost_to_finish)}};
  if (fits != "no") {
    j["micro_batch"] = micro_batch;
    j["accumulation_steps"] = accumulation;
    j["activation_checkpointing"] = activation_checkpointing;
    j["eval_batch"] = eval_batch;
  }
  return j;
}

CardForecast forecast(const Card& card, const Workload& w, double deadline_hours) {
  CardForecast f;
  const CardOption one = option_on(card, w, w.ranks, 1);
  f.fits = one.fits;
  f.plan = one.plan;
  f.placement = one.placement;
  f.micro_batch = one.micro_batch;
  f.accumulation = one.accumulation;
  f.activation_checkpointing = one.activation_checkpointing;
  f.eval_batch = one.eval_batch;
  f.predicted_peak_bytes = one.peak_bytes;
  f.predicted_step_seconds = one.step_seconds;
  f.hours_to_finish = one.hours_to_finish;
  f.cost_to_finish = one.cost_to_finish;

  f.to_fit = one.fits != "no" ? std::optional<CardOption>(one) : cards_that_fit(card, w, w.ranks);
  if (f.to_fit) f.next_size_up = cards_that_fit(card, w, w.ranks, f.to_fit->cards);
  if (w.offloaded) {
    const CardOption o = option_on(card, w, w.offloaded, 1);
    f.offload = CardForecast::Offload{o.fits != "no", o.peak_bytes, o.host_bytes};
  }
  for (const Workload::Lever& lever : w.levers) {
    if (f.to_fit && f.to_fit->cards == 1) break;  // nothing to gain
    const std::optional<CardOption> o = cards_that_fit(card, w, lever.ranks);
    if (o && (!f.to_fit || o->cards < f.to_fit->cards)) f.levers.emplace_back(lever.setting, *o);
  }

  if (one.fits == "no") {
    if (f.to_fit) {
      append(f.note, "on " + option_text(*f.to_fit) + " it fits");
      if (!f.to_fit->batch_divides)
        append(f.note, "train.batch_size " + std::to_string(w.global_batch) +
                           " must be a multiple of " + std::to_string(f.to_fit->cards));
    } else {
      append(f.note, "no count of cards up to " + std::to_string(kMaxCardsToFit) + " holds it");
    }
    for (const auto& [setting, o] : f.levers)
      append(f.note, "with " + setting + ": " + option_text(o));
  }
  if (!tflops_of(card, w)) {
    append(f.note, "no fp32_tflops for this card: the time is not predicted");
    return f;
  }
  if (w.flops_per_step <= 0) {
    append(f.note, "the model's FLOPs are not known: the time is not predicted");
    return f;
  }
  // The work a reclaim loses: the checkpoint interval of the option that runs.
  const CardOption* runs = one.fits != "no" ? &one : f.to_fit ? &*f.to_fit : nullptr;
  if (!runs || !runs->step_seconds) return f;
  const double step = *runs->step_seconds, hours = *runs->hours_to_finish;
  double interval = static_cast<double>(std::max<int64_t>(1, w.steps_per_epoch)) * step;
  if (w.checkpoint_every_seconds > 0) interval = std::min(interval, w.checkpoint_every_seconds);
  if (w.checkpoint_every_steps > 0)
    interval = std::min(interval, static_cast<double>(w.checkpoint_every_steps) * step);
  f.lost_hours_per_reclaim = std::min(interval / 3600.0, hours);
  if (card.price_per_hour)
    f.lost_cost_per_reclaim =
        *f.lost_hours_per_reclaim * *card.price_per_hour * static_cast<double>(runs->cards);
  if (one.fits != "no" && hours > deadline_hours) {
    const int64_t need = static_cast<int64_t>(std::ceil(hours / deadline_hours));
    // Each rank takes global / n samples a step (a micro-batch no larger than this card's).
    for (int64_t n = need; n <= w.global_batch; ++n) {
      if (w.global_batch % n != 0) continue;
      f.cards_for_deadline = n;
      break;
    }
    append(f.note, f.cards_for_deadline
                       ? "DDP on " + std::to_string(*f.cards_for_deadline) +
                             " cards, assuming linear scaling; each card holds the whole model"
                       : "the deadline needs " + std::to_string(need) +
                             " cards, more than the global batch of " +
                             std::to_string(w.global_batch) + " samples has");
  }
  return f;
}

nlohmann::json CardForecast::to_json(const Card& card) const {
  nlohmann::json levers_json = nlohmann::json::array();
  for (const auto& [setting, o] : levers) {
    nlohmann::json j = o.to_json();
    j["setting"] = setting;
    levers_json.push_back(j);
  }
  nlohmann::json j = {
      {"name", card.name},
      {"card", card.name},
      {"memory_bytes", card.memory_bytes},
      {"capacity_bytes", card.memory_bytes},
      {"fits", fits},
      {"plan", plan},
      {"placement", placement},
      {"predicted_peak_bytes", predicted_peak_bytes},
      {"predicted_step_seconds", or_null(predicted_step_seconds)},
      {"hours_to_finish", or_null(hours_to_finish)},
      {"cost_to_finish", or_null(cost_to_finish)},
      {"lost_hours_per_reclaim", or_null(lost_hours_per_reclaim)},
      {"lost_cost_per_reclaim", or_null(lost_cost_per_reclaim)},
      {"cards_for_deadline",
       cards_for_deadline ? nlohmann::json(*cards_for_deadline) : nlohmann::json()},
      {"note", note},
      {"cards_to_fit", to_fit ? nlohmann::json(to_fit->cards) : nlohmann::json()},
      {"cards_to_fit_bytes", to_fit ? nlohmann::json(to_fit->peak_bytes) : nlohmann::json()},
      {"to_fit", to_fit ? to_fit->to_json() : nlohmann::json()},
      {"next_size_up", next_size_up ? next_size_up->to_json() : nlohmann::json()},
      {"levers", levers_json},
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

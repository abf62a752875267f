// What a run needs on a rented card, before renting it: whether it fits (as configured, with a
// plan, or not), a predicted step time, the hours and the cost to finish, the work a reclaim
// loses, and how many cards DDP needs to meet a deadline. Pure arithmetic over the memory
// lines of the plan and the run's counted FLOPs, so that it is tested without a model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "forecast/cards.h"

namespace gpurun {

/// peak(b) = max(floor, fixed + b x per_sample), in bytes, for a micro-batch of b samples:
/// the forward and backward passes grow with b, the optimizer's update (`floor`) does not.
struct MemoryLine {
  double fixed = 0, per_sample = 0, floor = 0;
  double at(int64_t b) const {
    return std::max(floor, fixed + per_sample * static_cast<double>(b));
  }
};

/// What one rank of a run on some cards holds, under the optimizer placement the run takes
/// there (memory/placement.h).
struct RankLines {
  MemoryLine plain;                        ///< a training step without activation checkpointing
  std::optional<MemoryLine> checkpointed;  ///< with it; none: the model has no segments
  MemoryLine eval;                         ///< evaluation at eval batch b (between steps)
  int64_t state_bytes = 0;                 ///< checkpoint capture or resume loading, the larger
  int64_t host_bytes = 0;                  ///< offloaded state in host memory, a rank
  std::string placement;  ///< "optimizer + master weights" (memory/rank_state.h's names)
};

/// A run's ranks on `cards` cards of `capacity_bytes` each.
using RankLinesOn = std::function<RankLines(int64_t cards, int64_t capacity_bytes)>;

/// The run as the forecast sees it.
struct Workload {
  RankLinesOn ranks;         ///< the run as configured
  int64_t global_batch = 0;  ///< train.batch_size
  int64_t accumulation = 1;  ///< train.accumulation_steps: the configured micro-batch
  int64_t eval_batch = 0;
  std::string precision = "fp32";  ///< fp32, bf16 or fp16: which throughput applies
  /// FLOPs of one optimizer step at the global batch: 3 x the forward pass (the backward pass
  /// costs twice the forward; Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
  /// section 2.1), 4 x with activation checkpointing (one more forward).
  double flops_per_step = 0;
  double flops_per_step_checkpointed = 0;
  int64_t optimizer_steps = 0;  ///< to finish the configured epochs
  /// Seconds between checkpoints (the shortest of every_minutes, every_steps x step and an
  /// epoch); 0: an epoch, computed from the predicted step time.
  double checkpoint_every_seconds = 0;
  int64_t checkpoint_every_steps = 0;  ///< checkpoint.every_steps; 0: none
  int64_t steps_per_epoch = 0;
  double headroom = 0.1;  ///< memory.headroom: fraction of a card kept free
  /// Another setting of the run that changes what a card holds ("optim.master_weights: true",
  /// "optim.offload: host", "model.lora.rank: 16"), suggested where it takes fewer cards.
  struct Lever {
    std::string setting;
    RankLinesOn ranks;
  };
  std::vector<Lever> levers;
  /// The run with optim.offload: host, for CardForecast::offload; empty: not known.
  RankLinesOn offloaded;
};

/// The card counts a forecast rents, in order: the boxes of 1, 2, 4 and 8 cards, then whole
/// boxes of 8, up to kMaxCardsToFit.
std::vector<int64_t> rentable_card_counts();
/// The most cards cards_to_fit looks at.
inline constexpr int64_t kMaxCardsToFit = 64;

/// The share of a card's data-sheet throughput a training step reaches: PaLM measured 46% model
/// FLOPs utilisation on TPUs, large GPU runs report 35-55% (Chowdhery et al. 2022, "PaLM",
/// section 4.1); small models reach less. The forecast says that it assumes it.
inline constexpr double kAssumedUtilisation = 0.4;

/// The run on `cards` cards of one kind: its plan per rank and what it costs.
struct CardOption {
  int64_t cards = 1;
  std::string fits;  ///< "as_configured", "with_plan" or "no"
  std::string plan;  ///< "micro-batch 8 x accumulation 4, activation checkpointing, bf16"; why not
  std::string placement;                      ///< the optimizer placement a rank takes
  int64_t micro_batch = 0, accumulation = 1;  ///< per rank
  bool activation_checkpointing = false;
  int64_t eval_batch = 0;
  int64_t peak_bytes = 0;  ///< predicted, a card
  int64_t host_bytes = 0;  ///< offloaded state, a card's rank
  /// The global batch is not a multiple of `cards`: each rank's share is not whole, and the
  /// note says so.
  bool batch_divides = true;
  std::optional<double> step_seconds;  ///< an optimizer step, linear scaling over the cards
  std::optional<double> hours_to_finish;
  std::optional<double> cost_to_finish;  ///< all cards' hours x price; none without a price
  nlohmann::json to_json() const;
};

struct CardForecast {
  // One card, the run as configured.
  std::string fits;  ///< "as_configured", "with_plan" or "no"
  std::string plan;  ///< "micro-batch 8 x accumulation 4, activation checkpointing, bf16"; why not
  std::string placement;
  int64_t micro_batch = 0, accumulation = 1;
  bool activation_checkpointing = false;
  int64_t eval_batch = 0;
  int64_t predicted_peak_bytes = 0;
  std::optional<double> predicted_step_seconds;  ///< an optimizer step; none: not predicted
  std::optional<double> hours_to_finish;
  std::optional<double> cost_to_finish;          ///< none without a price
  std::optional<double> lost_hours_per_reclaim;  ///< at most, at the checkpoint interval
  std::optional<double> lost_cost_per_reclaim;   ///< those hours' price; none without a price
  /// When one card needs longer than the deadline: the fewest cards (dividing the global batch)
  /// that DDP needs to finish within it, assuming linear scaling; none otherwise or not possible.
  std::optional<int64_t> cards_for_deadline;
  std::string note;  ///< why a field is missing, what a count assumes, the levers that fit
  /// The fewest cards of this kind to rent that hold the run (rentable_card_counts() that
  /// divide the global batch; else the smallest count that divides it; else the smallest
  /// rentable count, whose note says the batch must change), with its plan, time and cost;
  /// none when no count up to kMaxCardsToFit holds it.
  std::optional<CardOption> to_fit;
  /// The next count up from to_fit (or from one card when one card holds the run), to
  /// compare its time and cost; none when there is none.
  std::optional<CardOption> next_size_up;
  /// One card with the optimizer state offloaded to host memory (optim.offload: host):
  /// whether the card holds it, and the card's and the host's bytes; none: not known.
  struct Offload {
    bool fits = false;
    int64_t card_bytes = 0, host_bytes = 0;
  };
  std::optional<Offload> offload;
  /// The run's levers (Workload::levers) that fit in fewer cards than to_fit, or fit where
  /// the run does not: each with its count of cards.
  std::vector<std::pair<std::string, CardOption>> levers;

  /// {name, memory_bytes, fits, plan, predicted_step_seconds, ..., cards_to_fit,
  /// cards_to_fit_bytes, to_fit: CardOption, next_size_up: CardOption, offload: {fits,
  /// card_bytes, host_bytes}, levers: [{setting, ...CardOption}]}, null for what is missing;
  /// plus card (the name), capacity_bytes and predicted_peak_bytes.
  nlohmann::json to_json(const Card& card) const;
};

/// Forecasts `w` on `card`. `deadline_hours` > 0.
CardForecast forecast(const Card& card, const Workload& w, double deadline_hours);

}  // namespace gpurun

// What a run needs on a rented card, before renting it: whether it fits (as configured, with a
// plan, or not), a predicted step time, the hours and the cost to finish, the work a reclaim
// loses, and how many cards DDP needs to meet a deadline. Pure arithmetic over the memory
// lines of the plan and the run's counted FLOPs, so that it is tested without a model.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "forecast/cards.h"

namespace gpurun {

/// peak(b) = fixed + b x per_sample, in bytes, for a micro-batch of b samples.
struct MemoryLine {
  double fixed = 0, per_sample = 0;
  double at(int64_t b) const { return fixed + per_sample * static_cast<double>(b); }
};

/// The run as the forecast sees it.
struct Workload {
  MemoryLine plain;                        ///< a training step without activation checkpointing
  std::optional<MemoryLine> checkpointed;  ///< with it; none: the model has no segments
  MemoryLine eval;                         ///< evaluation at eval batch b (between steps)
  int64_t state_bytes = 0;                 ///< checkpoint capture or resume loading, the larger
  int64_t global_batch = 0;                ///< train.batch_size
  int64_t micro_batch = 0;                 ///< as configured (global / accumulation)
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
  /// What one rank of `cards` needs for the smallest step (micro-batch 1, with activation
  /// checkpointing where the model has it) when the optimizer state is sharded over them
  /// (memory/rank_state.h: the better of modes optimizer and gradients), or with `offload` its
  /// state in host memory: bytes on the card and in the host's memory. Unset: not known, and
  /// the cards to fit and the offload answer are null.
  struct RankNeed {
    int64_t card_bytes = 0, host_bytes = 0;
  };
  std::function<RankNeed(int64_t cards, bool offload)> sharded;
};

/// The most cards cards_to_fit looks at.
inline constexpr int64_t kMaxCardsToFit = 64;

/// The share of a card's data-sheet throughput a training step reaches: PaLM measured 46% model
/// FLOPs utilisation on TPUs, large GPU runs report 35-55% (Chowdhery et al. 2022, "PaLM",
/// section 4.1); small models reach less. The forecast says that it assumes it.
inline constexpr double kAssumedUtilisation = 0.4;

struct CardForecast {
  std::string fits;  ///< "as_configured", "with_plan" or "no"
  std::string plan;  ///< "micro-batch 8 x accumulation 4, activation checkpointing, bf16"; why not
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
  std::string note;  ///< why a field is missing, or what the DDP count assumes
  /// The fewest cards of this kind that hold the run: 1 when one card does as it is, else
  /// with the optimizer state sharded over them (Workload::sharded), micro-batch 1; none when
  /// no count up to kMaxCardsToFit does, or not known. The global batch must be a multiple of
  /// it (the note says so when it is not).
  std::optional<int64_t> cards_to_fit;
  int64_t cards_to_fit_bytes = 0;  ///< what each of those cards holds at its peak
  /// One card with the optimizer state offloaded to host memory: whether the card holds it,
  /// and the card's and the host's bytes; none: not known.
  struct Offload {
    bool fits = false;
    int64_t card_bytes = 0, host_bytes = 0;
  };
  std::optional<Offload> offload;

  /// {name, memory_bytes, fits, plan, predicted_step_seconds, ..., cards_for_deadline,
  /// cards_to_fit, cards_to_fit_bytes, offload: {fits, card_bytes, host_bytes}}, null for what
  /// is missing; plus card (the name), capacity_bytes and predicted_peak_bytes.
  nlohmann::json to_json(const Card& card) const;
};

/// Forecasts `w` on `card`. `deadline_hours` > 0.
CardForecast forecast(const Card& card, const Workload& w, double deadline_hours);

}  // namespace gpurun

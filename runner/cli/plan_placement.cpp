#include "cli/plan_placement.h"

#include <algorithm>
#include <optional>
#include <ostream>
#include <utility>

#include "gpurun/model.h"
#include "memory/placement.h"
#include "memory/rank_state.h"
#include "util/units.h"

namespace gpurun {

/// Every placement's per-rank estimate of `step` (its activations and FLOPs kept) on
/// `world_size` ranks: the JSON's "modes".
nlohmann::json modes_json(const RunConfig& c, const StateShape& shape, const Estimate& step,
                          Precision precision, int64_t world_size) {
  nlohmann::json modes = nlohmann::json::array();
  for (const char* shard : {"none", "optimizer", "gradients"})
    for (const bool master : {false, true}) {
      if (master && precision == Precision::kFp32) continue;  // master weights are for 16 bits
      for (const bool offload : {false, true}) {
        OptimizerPlacement p;
        p.shard = shard;
        p.master_weights = master;
        p.offload = offload;
        const Estimate e = step.with_state(rank_state(shape, c.optim, precision, p, world_size));
        modes.push_back({{"name", placement_name(p)},
                         {"shard", shard},
                         {"master_weights", master},
                         {"offload", offload},
                         {"card_bytes", e.total()},
                         {"host_bytes", e.host_bytes},
                         {"breakdown", e.to_json()}});
      }
    }
  return modes;
}

namespace {

/// One rank's lines on `n` cards of `capacity` bytes: the placement place_optimizer() takes
/// there (the host's memory unknown: a rented box's), its state (rank_state()) under the
/// activations of micro-batch 1, plus what the plan measured beyond the estimate.
RankLines lines_of(const RunConfig& c, const StateShape& shape, const Estimate& one,
                   const std::optional<Estimate>& one_ck, Precision precision,
                   const LineCorrection& correction, int64_t n, int64_t capacity) {
  const Estimate smallest = one_ck ? *one_ck : one;
  const PlacementChoice choice =
      place_optimizer(c, shape, smallest, precision, n, capacity, /*check_host=*/false);
  const Estimate s = rank_state(shape, c.optim, precision, choice.placement, n);
  const double state = static_cast<double>(s.parameters + s.optimizer_state);
  const double backward = state + static_cast<double>(s.gradients + s.weight_casts);
  const double update = state + static_cast<double>((s.gradients_released ? 0 : s.gradients) +
                                                    s.gradient_slice + s.optimizer_temporaries);
  const double between_steps = state + static_cast<double>(s.gradients_released ? 0 : s.gradients);
  const auto at_least_zero = [](double v) { return std::max(0.0, v); };
  RankLines r;
  r.plain = {at_least_zero(backward + correction.training), static_cast<double>(one.activations),
             at_least_zero(update + correction.training)};
  if (one_ck)
    r.checkpointed =
        MemoryLine{r.plain.fixed, static_cast<double>(one_ck->activations), r.plain.floor};
  // Evaluation keeps nothing for a backward pass: at most what a checkpointed step keeps.
  r.eval = {at_least_zero(between_steps + correction.training),
            correction.eval_per_sample ? *correction.eval_per_sample
                                       : static_cast<double>((one_ck ? *one_ck : one).activations)};
  r.state_bytes = static_cast<int64_t>(at_least_zero(
      static_cast<double>(s.parameters + s.gradients + s.optimizer_state) + correction.state));
  r.host_bytes = s.host_bytes;
  r.placement = placement_name(choice.placement);
  return r;
}

}  // namespace

RankLinesOn rank_lines(const RunConfig& c, const StateShape& shape, const Estimate& one,
                       const std::optional<Estimate>& one_ck, Precision precision,
                       const LineCorrection& correction) {
  return [c, shape, one, one_ck, precision, correction](int64_t n, int64_t capacity) {
    return lines_of(c, shape, one, one_ck, precision, correction, n, capacity);
  };
}

void add_levers(Workload& w, const RunConfig& c, const StateShape& shape,
                const std::optional<StateShape>& lora_shape, const Estimate& one,
                const std::optional<Estimate>& one_ck, Precision precision,
                const LineCorrection& correction) {
  const auto lever = [&](const std::string& setting, const RunConfig& changed,
                         const StateShape& changed_shape) {
    w.levers.push_back(
        {setting, rank_lines(changed, changed_shape, one, one_ck, precision, correction)});
  };
  if (precision != Precision::kFp32 && !c.optim.master_weights) {
    RunConfig master = c;
    master.optim.master_weights = true;
    lever("optim.master_weights: true", master, shape);
  }
  RunConfig offload = c;
  offload.optim.offload = "host";
  w.offloaded = rank_lines(offload, shape, one, one_ck, precision, correction);
  if (c.optim.offload != "host") lever("optim.offload: host", offload, shape);
  if (precision != Precision::kFp32 && !c.optim.master_weights && c.optim.offload != "host") {
    RunConfig both = offload;
    both.optim.master_weights = true;
    lever("optim.master_weights: true and optim.offload: host", both, shape);
  }
  if (lora_shape && c.model.lora.rank == 0) {
    RunConfig lora = c;
    lora.model.lora.rank = kLoraLeverRank;
    lever("model.lora.rank: " + std::to_string(kLoraLeverRank) + " (LoRA on every Linear layer)",
          lora, *lora_shape);
  }
}

std::pair<Estimate, std::optional<Estimate>> per_sample(const RunConfig& c, const Session& session,
                                                        const Estimate& plain, const Estimate& ck,
                                                        int64_t micro) {
  const auto one = [micro](Estimate e) {
    e.activations /= std::max<int64_t>(1, micro);
    return e;
  };
  const bool checkpointing =
      !session.model->segments().empty() && may_checkpoint(memory_strategy(c.memory.strategy));
  return {one(plain), checkpointing ? std::optional<Estimate>(one(ck)) : std::nullopt};
}

Estimate smallest_of(const RunConfig& c, const Session& session, const Estimate& plain,
                     const Estimate& ck, int64_t micro) {
  const auto [one, one_ck] = per_sample(c, session, plain, ck, micro);
  return one_ck ? *one_ck : one;
}

void print_placement(std::ostream& out, const std::string& name, int64_t world_size,
                     const std::string& reason, int64_t host_bytes) {
  out << "placement       " << name << " over " << world_size << " rank"
      << (world_size == 1 ? "" : "s") << " (" << reason << ")"
      << (host_bytes > 0 ? "; " + format_bytes(host_bytes) + " of host memory a rank" : "") << "\n";
}

}  // namespace gpurun

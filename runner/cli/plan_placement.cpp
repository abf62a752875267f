#include "cli/plan_placement.h"

#include <algorithm>
#include <ostream>
#include <utility>

#include "gpurun/model.h"
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

/// Workload::sharded for the forecast: on n cards the better of modes optimizer and gradients
/// (one card: the flat optimizer alone), master weights as configured, for the smallest step
/// `one` (its activations).
std::function<Workload::RankNeed(int64_t, bool)> sharded_need(const RunConfig& c, StateShape shape,
                                                              Estimate one, Precision precision) {
  const bool master = uses_master_weights(c, precision);
  return
      [optim = c.optim, master, shape = std::move(shape), one, precision](int64_t n, bool offload) {
        Workload::RankNeed best;
        bool have = false;
        for (const char* mode : {"optimizer", "gradients"}) {
          OptimizerPlacement p;
          p.shard = n == 1 ? "none" : mode;
          p.master_weights = master;
          p.offload = offload;
          const Estimate e = one.with_state(rank_state(shape, optim, precision, p, n));
          if (!have || e.total() < best.card_bytes) best = {e.total(), e.host_bytes};
          have = true;
        }
        return best;
      };
}

/// The smallest step's activations: micro-batch 1 of `e` (estimated at `micro`), checkpointed
/// (`ck`) where the plan may checkpoint.
Estimate smallest_of(const RunConfig& c, const Session& session, const Estimate& plain,
                     const Estimate& ck, int64_t micro) {
  const bool checkpointing = !session.model->segments().empty() &&
                             (c.memory.strategy == "auto" || c.memory.strategy == "checkpoint");
  Estimate one = checkpointing ? ck : plain;
  one.activations /= std::max<int64_t>(1, micro);
  return one;
}

void print_placement(std::ostream& out, const std::string& name, int64_t world_size,
                     const std::string& reason, int64_t host_bytes) {
  out << "placement       " << name << " over " << world_size << " rank"
      << (world_size == 1 ? "" : "s") << " (" << reason << ")"
      << (host_bytes > 0 ? "; " + format_bytes(host_bytes) + " of host memory a rank" : "") << "\n";
}

}  // namespace gpurun

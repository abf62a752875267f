#include "memory/placement.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "gpurun/errors.h"
#include "memory/meter.h"
#include "memory/planner.h"
#include "memory/rank_state.h"
#include "util/units.h"

namespace gpurun {
namespace {

std::string bytes_text(int64_t bytes) {
  return std::to_string(bytes) + " bytes (" + format_bytes(bytes) + ")";
}

bool host_holds(const Estimate& e, const PlacementRequest& r) {
  return r.host_usable_bytes <= 0 || host_need(e, r) <= r.host_usable_bytes;
}

/// "optimizer + offload needs 12.0 GiB a rank": a tried placement for the reason.
std::string need_text(const OptimizerPlacement& p, const Estimate& e) {
  return placement_name(p) + " needs " + format_bytes(e.total()) + " a rank";
}

/// "; gradients + offload would fit (104.4 MiB a rank, 20 MiB of host memory): set
/// distributed.shard: gradients and optim.offload: host", for the first placement outside
/// `tried` that fits, in the order offload, other shard modes, master weights; "" when none.
std::string would_fit(const PlacementRequest& r,
                      const std::function<Estimate(const OptimizerPlacement&)>& smallest,
                      const std::function<bool(const Estimate&)>& fits,
                      const std::vector<OptimizerPlacement>& tried) {
  std::vector<const char*> shards{"none"};
  if (r.world_size > 1) shards = {"optimizer", "gradients", "none"};
  std::vector<bool> masters{r.master_weights};
  if (r.sixteen_bits && !r.master_weights) masters.push_back(true);
  for (const bool master : masters)
    for (const bool offload : {false, true})
      for (const char* shard : shards) {
        OptimizerPlacement p;
        p.shard = shard;
        p.master_weights = master;
        p.offload = offload;
        const bool seen = std::any_of(tried.begin(), tried.end(), [&](const OptimizerPlacement& t) {
          return t.shard == p.shard && t.master_weights == p.master_weights &&
                 t.offload == p.offload;
        });
        const Estimate e = smallest(p);
        if (seen || !fits(e) || !host_holds(e, r)) continue;
        std::vector<std::string> settings;
        if (p.shard != "none" && p.shard != r.shard)
          settings.push_back("distributed.shard: " + p.shard);
        if (p.offload && r.offload != "host") settings.push_back("optim.offload: host");
        if (p.master_weights && !r.master_weights) settings.push_back("optim.master_weights: true");
        std::string set;
        for (size_t i = 0; i < settings.size(); ++i)
          set += (i == 0 ? "" : i + 1 == settings.size() ? " and " : ", ") + settings[i];
        return "; " + placement_name(p) + " would fit (" + format_bytes(e.total()) + " a rank" +
               (p.offload ? ", " + format_bytes(host_need(e, r)) + " of host memory" : "") + ")" +
               (set.empty() ? "" : ": set " + set);
      }
  return "";
}

}  // namespace

int64_t host_need(const Estimate& e, const PlacementRequest& request) {
  return e.host_bytes * std::max<int64_t>(1, request.ranks_per_host);
}

PlacementChoice choose_placement(const PlacementRequest& r,
                                 const std::function<Estimate(const OptimizerPlacement&)>& smallest,
                                 const std::function<bool(const Estimate&)>& fits) {
  PlacementChoice choice;
  OptimizerPlacement base;
  base.master_weights = r.master_weights;
  base.offload = r.offload == "host";
  std::string shard = r.shard;
  if (r.world_size <= 1 && (shard == "optimizer" || shard == "gradients")) {
    choice.note = "distributed.shard: " + shard +
                  " with one rank: there is nothing to shard over, so the optimizer state stays "
                  "whole on this rank (it shards with a world size above 1)";
    shard = "none";
  }
  std::vector<OptimizerPlacement> candidates;
  const bool shard_auto =
      shard == "auto" && r.world_size > 1 && r.strategy == MemoryStrategy::kAuto;
  if (shard_auto) {
    for (const char* mode : {"none", "optimizer", "gradients"}) {
      // Master weights or offload alone already shard the state over the ranks (the flat
      // optimizer), as optimizer does: no replicated candidate then.
      if (std::string(mode) == "none" && base.flat()) continue;
      OptimizerPlacement p = base;
      p.shard = mode;
      candidates.push_back(p);
    }
  } else {
    base.shard = shard == "auto" ? "none" : shard;
    candidates.push_back(base);
  }
  const bool offload_auto = r.offload == "auto" && r.strategy == MemoryStrategy::kAuto;
  if (offload_auto) {
    for (size_t i = 0, n = candidates.size(); i < n; ++i) {
      // Offload only shards that are worth it: with several ranks, sharded ones.
      if (shard_auto && candidates[i].shard == "none") continue;
      OptimizerPlacement p = candidates[i];
      p.offload = true;
      candidates.push_back(p);
    }
  }

  std::string tried;  // what did not fit, for the reason
  bool chosen = false;
  Estimate best_estimate;
  OptimizerPlacement best;
  bool have_best = false;
  for (const OptimizerPlacement& p : candidates) {
    const Estimate e = smallest(p);
    const bool on_host = host_holds(e, r);
    if (fits(e) && on_host) {
      choice.placement = p;
      choice.smallest = e;
      if (tried.empty() && !shard_auto && r.shard == "auto")
        choice.reason =
            r.world_size > 1
                ? "memory.strategy " + std::string(strategy_name(r.strategy)) + " does not shard"
                : "one rank";
      else if (tried.empty() && !shard_auto)
        choice.reason = "as configured";
      else if (tried.empty() && !p.flat())
        choice.reason = "fits replicated";
      else if (tried.empty())
        choice.reason = placement_name(p) + " fits (" + format_bytes(e.total()) + " a rank)";
      else
        choice.reason =
            tried + "; " + placement_name(p) + " fits (" + format_bytes(e.total()) + " a rank" +
            (p.offload ? ", " + format_bytes(host_need(e, r)) + " of host memory" : "") + ")";
      chosen = true;
      break;
    }
    if (!tried.empty()) tried += ", ";
    tried += need_text(p, e);
    if (!on_host)
      tried += " and " + format_bytes(host_need(e, r)) + " of host memory, more than its " +
               format_bytes(r.host_usable_bytes);
    if (on_host && (!have_best || e.total() < best_estimate.total())) {
      best = p;
      best_estimate = e;
      have_best = true;
    }
  }
  if (!chosen) {
    // The smallest need the host holds; none: the first candidate (refused below when asked).
    choice.placement = have_best ? best : candidates.front();
    choice.smallest = have_best ? best_estimate : smallest(candidates.front());
    choice.reason = "nothing fits the " + format_bytes(r.usable_bytes) + " usable: " + tried +
                    would_fit(r, smallest, fits, candidates);
  }
  // An offload the user asked for must fit the host: refused before anything is built.
  if (r.offload == "host" && !host_holds(choice.smallest, r)) {
    const int64_t need = host_need(choice.smallest, r);
    throw ConfigError("optim.offload: host needs " + bytes_text(choice.smallest.host_bytes) +
                      " of host memory a rank (" + placement_name(choice.placement) +
                      ": optimizer state, master slice and gradient copy) x " +
                      std::to_string(std::max<int64_t>(1, r.ranks_per_host)) +
                      (r.ranks_per_host > 1 ? " ranks" : " rank") + " on this host = " +
                      bytes_text(need) + ", the host has " + bytes_text(r.host_usable_bytes) +
                      " usable for it (GPURUN_HOST_MEMORY overrides); use more ranks "
                      "(distributed.shard cuts the state per rank), a host with more memory, or "
                      "optim.offload: none");
  }
  return choice;
}

int64_t host_capacity_bytes() {
  if (const char* v = std::getenv("GPURUN_HOST_MEMORY"); v && *v) {
    try {
      return parse_size(v);
    } catch (const std::exception& e) {
      throw ConfigError(std::string("GPURUN_HOST_MEMORY: ") + e.what());
    }
  }
  return cpu_tensor_capacity_bytes(static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) *
                                   sysconf(_SC_PAGESIZE));
}

namespace {
int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  try {
    return std::max<int64_t>(1, std::stoll(v));
  } catch (const std::exception&) {
    return fallback;
  }
}
}  // namespace

int64_t placement_world_size(int64_t world_size) {
  return world_size > 0 ? world_size : env_int("WORLD_SIZE", 1);
}

PlacementChoice place_optimizer(const RunConfig& config, const StateShape& state,
                                const Estimate& smallest, Precision precision, int64_t world_size,
                                int64_t capacity_bytes, bool check_host) {
  PlacementRequest r;
  r.shard = config.distributed.shard;
  r.offload = config.optim.offload;
  r.master_weights = uses_master_weights(config, precision);
  r.sixteen_bits = precision != Precision::kFp32;
  r.strategy = memory_strategy(config.memory.strategy);
  r.world_size = world_size;
  PlanRequest capacity;
  capacity.capacity_bytes = capacity_bytes;
  capacity.headroom = config.memory.headroom;
  r.usable_bytes = usable_bytes(capacity);
  r.host_usable_bytes = check_host ? host_capacity_bytes() : 0;
  r.ranks_per_host = std::min(world_size, env_int("LOCAL_WORLD_SIZE", 1));
  return choose_placement(
      r,
      [&](const OptimizerPlacement& p) {
        return smallest.with_state(rank_state(state, config.optim, precision, p, world_size));
      },
      [&](const Estimate& e) { return !exceeds_by_estimate(e, r.usable_bytes); });
}

bool exceeds_by_estimate(const Estimate& e, int64_t usable_bytes) {
  Estimate low = e;
  low.activations = e.activations - e.activations / 10;
  return low.total() > usable_bytes;
}
}  // namespace gpurun

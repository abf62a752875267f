#include "memory/planner.h"

#include <algorithm>
#include <optional>

#include <spdlog/spdlog.h>

#include "gpurun/config.h"
#include "gpurun/errors.h"
#include "util/units.h"

namespace gpurun {
namespace {

bool fits(const Probe& p, int64_t usable) { return p.measured() && p.peak_bytes <= usable; }

/// What a probe that did not fit shows it needs, in bytes: its measured or estimated peak; out
/// of memory, its estimate when that is above the capacity, else one byte more than the
/// capacity (all that is known).
int64_t need_of(const Probe& p, int64_t capacity) {
  if (!p.out_of_memory) return p.peak_bytes;
  return std::max(p.estimated_bytes, capacity + 1);
}

/// The smallest card that holds `need` bytes, or "" (none, or no table).
std::string card_for(const PlanRequest& req, int64_t need) {
  return req.card_for ? req.card_for(need) : "";
}

/// "123 bytes (123 B, measured)", or "more than the device's 456 bytes (456 B; out of memory)".
std::string need_text(const Probe& p, int64_t capacity) {
  const int64_t need = need_of(p, capacity);
  if (p.out_of_memory && need == capacity + 1)
    return "more than the device's " + std::to_string(capacity) + " bytes (" +
           format_bytes(capacity) + "; out of memory)";
  const char* how = p.estimated       ? "estimated, not run"
                    : p.out_of_memory ? "estimated; out of memory when run"
                                      : "measured";
  return std::to_string(need) + " bytes (" + format_bytes(need) + ", " + how + ")";
}

/// peak(b) = fixed + b x per_sample through the two non-OOM probes with the smallest
/// micro-batches (the regime the search is moving into); nullopt with fewer than two.
std::optional<double> predict(const std::vector<Probe>& points, int64_t micro) {
  std::vector<Probe> sorted = points;
  std::sort(sorted.begin(), sorted.end(),
            [](const Probe& a, const Probe& b) { return a.micro_batch < b.micro_batch; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    const Probe &a = sorted[i - 1], &b = sorted[i];
    if (a.micro_batch == b.micro_batch) continue;
    const double per_sample =
        static_cast<double>(b.peak_bytes - a.peak_bytes) / (b.micro_batch - a.micro_batch);
    return a.peak_bytes + (micro - a.micro_batch) * per_sample;
  }
  return std::nullopt;
}

/// The largest micro-batch below `first.micro_batch` (which does not fit) that fits, searched
/// over the divisors of global/world: halving until one fits, then the line through two
/// measured points proposes the largest that should, and a probe confirms it.
std::optional<Probe> fit_micro_batch(const PlanRequest& req, bool checkpointing, const Probe& first,
                                     const TrainProbeFn& probe) {
  const int64_t usable = usable_bytes(req);
  std::vector<Probe> points;
  if (first.measured()) points.push_back(first);
  int64_t hi = first.micro_batch;  // smallest micro-batch known not to fit
  std::optional<Probe> best;       // largest micro-batch known to fit
  const std::vector<int64_t> divisors = divisors_descending(req.global_batch / req.world_size);
  for (int guard = 0; guard < 64; ++guard) {
    std::vector<int64_t> open;  // untried candidates strictly between best and hi
    for (int64_t d : divisors)
      if (d < hi && (!best || d > best->micro_batch)) open.push_back(d);
    if (open.empty()) return best;
    int64_t next = open.back();  // the smallest, unless a better guess exists
    if (auto guess = predict(points, open.front()); guess) {
      for (int64_t d : open)
        if (*predict(points, d) <= usable) {
          next = d;
          break;
        }
      if (best && *predict(points, next) > usable) return best;
    } else {
      for (int64_t d : open)
        if (d <= hi / 2) {
          next = d;
          break;
        }
    }
    Probe p = probe(next, checkpointing);
    p.micro_batch = next;
    p.checkpointing = checkpointing;
    if (p.measured()) points.push_back(p);
    if (fits(p, usable)) {
      best = p;
    } else {
      hi = next;
    }
  }
  return best;
}

[[noreturn]] void nothing_fits(const PlanRequest& req, const Probe& smallest,
                               const std::string& what) {
  const std::string card = card_for(req, need_of(smallest, req.capacity_bytes));
  throw ConfigError(
      "the run does not fit: " + what + " needs " + need_text(smallest, req.capacity_bytes) +
      ", the device has " + std::to_string(req.capacity_bytes) + " bytes (" +
      format_bytes(req.capacity_bytes) + ") of which " + std::to_string(usable_bytes(req)) +
      " usable with memory.headroom " + std::to_string(req.headroom) + "; " +
      (card.empty() ? "no card of the table is large enough: use a smaller model"
                    : "the smallest card that fits: " + card));
}

/// Refuses a plan whose checkpoint capture or resume loading does not fit: nothing the planner
/// chooses makes them smaller, so the message says what does.
void require_fits(const PlanRequest& req, const Probe& p, const std::string& part,
                  const std::string& holds) {
  const int64_t usable = usable_bytes(req);
  if (fits(p, usable)) return;
  const std::string card = p.out_of_memory ? "" : card_for(req, need_of(p, req.capacity_bytes));
  throw ConfigError(
      "the run does not fit: " + part + " needs " + need_text(p, req.capacity_bytes) +
      ", the device has " + std::to_string(req.capacity_bytes) + " bytes (" +
      format_bytes(req.capacity_bytes) + ") of which " + std::to_string(usable) +
      " usable with memory.headroom " + std::to_string(req.headroom) + ". It holds " + holds +
      ", so a smaller micro-batch, gradient accumulation or activation checkpointing cannot "
      "make it smaller; use a device with more memory (or a larger --memory-limit)" +
      (card.empty() ? "" : ", e.g. " + card) +
      ", a smaller model, or an optimizer with less state (optim.name: sgd)");
}

struct Part {
  const char* key;     ///< in JSON
  const char* words;   ///< in messages
  int64_t bytes;       ///< as probed
  bool between_saves;  ///< runs while the checkpoint buffers are held
};

/// The parts of a run in the order it meets them.
std::vector<Part> parts(const MeasuredPeaks& m) {
  return {{"training", "training steps", m.training, true},
          {"evaluation", "evaluation", m.evaluation, true},
          {"checkpoint_capture", "checkpoint capture", m.checkpoint_capture, false},
          {"resume_loading", "resume loading", m.resume_loading, false}};
}

/// A part's peak in the run: training and evaluation run with the checkpoint buffers held.
int64_t in_run(const MeasuredPeaks& m, const Part& p) {
  return p.bytes > 0 && p.between_saves ? p.bytes + m.checkpoint_buffers : p.bytes;
}

}  // namespace

int64_t MeasuredPeaks::largest() const {
  int64_t top = 0;
  for (const Part& p : parts(*this)) top = std::max(top, in_run(*this, p));
  return top;
}

std::string MeasuredPeaks::largest_part() const {
  const int64_t top = largest();
  for (const Part& p : parts(*this))
    if (top > 0 && in_run(*this, p) == top) return p.key;
  return "";
}

std::string MeasuredPeaks::to_string() const {
  const std::string top = largest_part();
  std::string out;
  for (const Part& p : parts(*this)) {
    if (p.bytes <= 0) continue;
    if (!out.empty()) out += ", ";
    out += std::string(p.words) + " " + format_bytes(p.bytes) + (p.key == top ? " (largest)" : "");
  }
  if (checkpoint_buffers > 0 && !out.empty())
    out += ", + " + format_bytes(checkpoint_buffers) + " checkpoint buffers kept between saves";
  return out;
}

nlohmann::json MeasuredPeaks::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const Part& p : parts(*this))
    if (p.bytes > 0) j[p.key] = p.bytes;
  if (checkpoint_buffers > 0) j["checkpoint_buffers"] = checkpoint_buffers;
  if (checkpoint_copy > 0) j["checkpoint_copy"] = checkpoint_copy;
  return j;
}

MeasuredPeaks MeasuredPeaks::from_json(const nlohmann::json& j) {
  MeasuredPeaks m;
  if (!j.is_object()) return m;
  m.training = j.value("training", int64_t{0});
  m.evaluation = j.value("evaluation", int64_t{0});
  m.checkpoint_capture = j.value("checkpoint_capture", int64_t{0});
  m.resume_loading = j.value("resume_loading", int64_t{0});
  m.checkpoint_buffers = j.value("checkpoint_buffers", int64_t{0});
  m.checkpoint_copy = j.value("checkpoint_copy", int64_t{0});
  return m;
}

void MemoryPlan::validate() const {
  if (micro_batch < 1 || accumulation_steps < 1 || world_size < 1 ||
      global_batch != micro_batch * accumulation_steps * world_size)
    throw ConfigError("memory plan: global batch " + std::to_string(global_batch) +
                      " != micro-batch " + std::to_string(micro_batch) + " x accumulation " +
                      std::to_string(accumulation_steps) + " x world size " +
                      std::to_string(world_size));
}

nlohmann::json MemoryPlan::to_json() const {
  nlohmann::json j = {{"global_batch", global_batch},
                      {"micro_batch", micro_batch},
                      {"accumulation_steps", accumulation_steps},
                      {"world_size", world_size},
                      {"eval_batch", eval_batch},
                      {"activation_checkpointing", activation_checkpointing},
                      {"measured_peak_bytes", measured_peak_bytes},
                      {"measured_peaks", measured.to_json()},
                      {"peak_part", measured.largest_part()},
                      {"estimated_peak_bytes", estimated_peak_bytes},
                      {"capacity_bytes", capacity_bytes},
                      {"step_seconds", step_seconds},
                      {"reason", reason},
                      {"precision", precision},
                      {"shard", shard},
                      {"offload", offload},
                      {"shard_reason", shard_reason},
                      {"host_bytes", host_bytes}};
  if (!estimate.is_null()) j["estimate"] = estimate;
  return j;
}

MemoryPlan MemoryPlan::from_json(const nlohmann::json& j) {
  MemoryPlan p;
  p.global_batch = j.value("global_batch", int64_t{0});
  p.micro_batch = j.value("micro_batch", int64_t{0});
  p.accumulation_steps = j.value("accumulation_steps", int64_t{1});
  p.world_size = j.value("world_size", int64_t{1});
  p.eval_batch = j.value("eval_batch", int64_t{0});
  p.activation_checkpointing = j.value("activation_checkpointing", false);
  p.measured_peak_bytes = j.value("measured_peak_bytes", int64_t{0});
  if (j.contains("measured_peaks")) p.measured = MeasuredPeaks::from_json(j["measured_peaks"]);
  p.estimated_peak_bytes = j.value("estimated_peak_bytes", int64_t{0});
  if (j.contains("estimate")) p.estimate = j["estimate"];
  p.capacity_bytes = j.value("capacity_bytes", int64_t{0});
  p.step_seconds = j.value("step_seconds", 0.0);
  p.reason = j.value("reason", std::string());
  p.precision = j.value("precision", std::string("fp32"));
  p.shard = j.value("shard", std::string("none"));
  p.offload = j.value("offload", false);
  p.shard_reason = j.value("shard_reason", std::string());
  p.host_bytes = j.value("host_bytes", int64_t{0});
  return p;
}

int64_t usable_bytes(const PlanRequest& r) {
  return static_cast<int64_t>(static_cast<double>(r.capacity_bytes) * (1.0 - r.headroom));
}

std::vector<int64_t> divisors_descending(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = n; d >= 1; --d)
    if (n % d == 0) out.push_back(d);
  return out;
}

MemoryPlan choose_plan(const PlanRequest& req, const TrainProbeFn& train_probe,
                       const EvalProbeFn& eval_probe, const CheckpointProbeFn& checkpoint_probe) {
  const int64_t usable = usable_bytes(req);
  MemoryPlan plan;
  plan.global_batch = req.global_batch;
  plan.world_size = req.world_size;
  plan.capacity_bytes = req.capacity_bytes;
  auto adopt = [&](const Probe& p, const std::string& reason) {
    plan.micro_batch = p.micro_batch;
    plan.accumulation_steps = req.global_batch / req.world_size / p.micro_batch;
    plan.activation_checkpointing = p.checkpointing;
    plan.measured.training = p.peak_bytes;
    plan.step_seconds = p.step_seconds;
    plan.reason = reason;
  };

  Probe base = train_probe(req.micro_batch, false);
  base.micro_batch = req.micro_batch;
  if (fits(base, usable)) {
    adopt(base, "fits as configured");
  } else {
    spdlog::warn("micro-batch {} needs {}, more than the {} usable of {}", req.micro_batch,
                 need_text(base, req.capacity_bytes), format_bytes(usable),
                 format_bytes(req.capacity_bytes));
    if (req.strategy == MemoryStrategy::kNone)
      throw ConfigError("memory.strategy is none and micro-batch " +
                        std::to_string(req.micro_batch) + " does not fit in " +
                        format_bytes(usable) + "; set memory.strategy: auto");
    std::vector<std::pair<Probe, std::string>> options;
    auto consider = [&](const std::optional<Probe>& p, const std::string& why) {
      if (p) options.emplace_back(*p, why);
    };
    if (may_accumulate(req.strategy))
      consider(fit_micro_batch(req, false, base, train_probe), "gradient accumulation");
    if (req.can_checkpoint && may_checkpoint(req.strategy)) {
      Probe ckpt = train_probe(req.micro_batch, true);
      ckpt.micro_batch = req.micro_batch;
      ckpt.checkpointing = true;
      if (fits(ckpt, usable))
        consider(ckpt, "activation checkpointing");
      else
        consider(fit_micro_batch(req, true, ckpt, train_probe),
                 "activation checkpointing and gradient accumulation");
    }
    if (options.empty()) {
      const bool checkpointing = req.can_checkpoint && req.strategy != MemoryStrategy::kAccumulate;
      Probe one = train_probe(1, checkpointing);
      one.micro_batch = 1;
      nothing_fits(
          req, one,
          std::string("micro-batch 1") + (checkpointing ? " with activation checkpointing" : ""));
    }
    auto best = std::min_element(options.begin(), options.end(), [](const auto& a, const auto& b) {
      return a.first.seconds_per_sample() < b.first.seconds_per_sample();
    });
    adopt(best->first,
          best->second + " (fastest fitting option of " + std::to_string(options.size()) + ")");
  }

  plan.eval_batch = req.eval_batch;
  for (;;) {
    Probe e = eval_probe(plan.eval_batch, plan);
    if (fits(e, usable)) {
      plan.measured.evaluation = e.peak_bytes;
      break;
    }
    if (plan.eval_batch == 1) nothing_fits(req, e, "evaluation of eval batch 1");
    plan.eval_batch = std::max<int64_t>(1, plan.eval_batch / 2);
  }
  if (plan.eval_batch != req.eval_batch)
    spdlog::warn("evaluation batch {} does not fit; evaluating in batches of {}", req.eval_batch,
                 plan.eval_batch);

  const CheckpointProbes c = checkpoint_probe(plan);
  require_fits(req, c.capture, "checkpoint capture",
               "the weights, gradients and optimizer state and copies them for the checkpoint");
  require_fits(req, c.resume, "resume loading",
               "the weights and the checkpoint's tensors while they are loaded into the model "
               "and optimizer");
  plan.measured.checkpoint_capture = c.capture.peak_bytes;
  plan.measured.resume_loading = c.resume.peak_bytes;
  plan.measured.checkpoint_copy = c.copy_bytes;
  if (c.copy_bytes > 0) {
    const int64_t between_saves =
        std::max(plan.measured.training, plan.measured.evaluation) + c.copy_bytes;
    if (between_saves <= usable_bytes(req))
      plan.measured.checkpoint_buffers = c.copy_bytes;
    else
      spdlog::info(
          "the checkpoint's copy of the state ({}) is released after every save: kept between "
          "saves it would not fit next to training and evaluation ({} of {} usable), so every "
          "save allocates it again and is written before training goes on (a longer stall)",
          format_bytes(c.copy_bytes), format_bytes(between_saves), format_bytes(usable_bytes(req)));
  }
  plan.measured_peak_bytes = plan.measured.largest();
  plan.validate();
  return plan;
}

bool write_before_training(const MemoryPlan& plan) {
  return plan.measured.checkpoint_copy > 0 && plan.measured.checkpoint_buffers == 0;
}

MemoryPlan halve_micro_batch(const MemoryPlan& plan) {
  const int64_t per_rank = plan.global_batch / plan.world_size;
  for (int64_t d : divisors_descending(per_rank)) {
    if (d > plan.micro_batch / 2) continue;
    MemoryPlan next = plan;
    next.micro_batch = d;
    next.accumulation_steps = per_rank / d;
    next.measured_peak_bytes = 0;
    next.measured.training = 0;
    next.measured.checkpoint_buffers = 0;
    next.reason = "out of memory at micro-batch " + std::to_string(plan.micro_batch);
    next.validate();
    return next;
  }
  throw ConfigError("out of memory at micro-batch " + std::to_string(plan.micro_batch) +
                    " with a capacity of " + std::to_string(plan.capacity_bytes) + " bytes (" +
                    format_bytes(plan.capacity_bytes) + "): there is no smaller micro-batch; " +
                    "run `gpurun plan` to see which card fits");
}

MemoryStrategy memory_strategy(const std::string& setting) {
  if (setting == "auto") return MemoryStrategy::kAuto;
  if (setting == "accumulate") return MemoryStrategy::kAccumulate;
  if (setting == "checkpoint") return MemoryStrategy::kCheckpoint;
  if (setting == "none") return MemoryStrategy::kNone;
  throw ConfigError("memory.strategy must be auto, accumulate, checkpoint or none, got \"" +
                    setting + "\"");
}

const char* strategy_name(MemoryStrategy strategy) {
  static const char* const kNames[] = {"auto", "accumulate", "checkpoint", "none"};
  return kNames[static_cast<int>(strategy)];
}

}  // namespace gpurun

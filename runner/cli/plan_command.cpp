#include "cli/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

#include "gpurun/model.h"
#include "memory/meter.h"
#include "model/activation_checkpointing.h"
#include "model/fine_tune.h"
#include "report/reporter.h"
#include "train/run_setup.h"
#include "util/units.h"

namespace gpurun {
namespace {

/// peak(b) = fixed + b x per_sample, in bytes.
struct Line {
  double fixed = 0, per_sample = 0;
  double at(int64_t b) const { return fixed + per_sample * static_cast<double>(b); }
};

/// What a card of `bytes` allows, predicted from the lines: as configured, with accumulation,
/// with activation checkpointing, or not at all. Checkpoint capture and resume loading
/// (`state_bytes`, their larger) must fit as measured; evaluation is predicted by `eval` and
/// its batch halved as the planner does.
nlohmann::json card_verdict(const std::string& name, int64_t bytes, const RunConfig& c,
                            int64_t micro, const Line& plain, const Line* checkpointed,
                            int64_t state_bytes, const Line& eval, int64_t eval_batch) {
  const double usable = static_cast<double>(bytes) * (1.0 - c.memory.headroom);
  nlohmann::json j = {{"card", name}, {"capacity_bytes", bytes}};
  if (static_cast<double>(state_bytes) > usable) {
    j["fits"] = "does not fit: checkpoint capture or resume loading needs " +
                format_bytes(state_bytes) + ", which no micro-batch changes";
    j["predicted_peak_bytes"] = state_bytes;
    return j;
  }
  int64_t b = eval_batch;
  while (b > 1 && eval.at(b) > usable) b = std::max<int64_t>(1, b / 2);
  if (eval.at(b) > usable) {
    j["fits"] = "does not fit: evaluation needs " + format_bytes(static_cast<int64_t>(eval.at(b))) +
                " at eval batch 1";
    j["predicted_peak_bytes"] = static_cast<int64_t>(eval.at(b));
    return j;
  }
  const std::string eval_note = b == eval_batch ? "" : "; eval batch " + std::to_string(b);
  const double others = std::max(static_cast<double>(state_bytes), eval.at(b));
  auto verdict = [&](const std::string& fits, double train_peak) {
    j["fits"] = fits + eval_note;
    j["predicted_peak_bytes"] = static_cast<int64_t>(std::max(train_peak, others));
    return j;
  };
  if (plain.at(micro) <= usable) return verdict("as configured", plain.at(micro));
  const int64_t per_rank = c.train.batch_size;
  for (int64_t d : divisors_descending(per_rank)) {
    if (d >= micro) continue;
    if (plain.at(d) <= usable)
      return verdict("gradient accumulation: micro-batch " + std::to_string(d) + " x " +
                         std::to_string(per_rank / d),
                     plain.at(d));
    if (checkpointed && checkpointed->at(d) <= usable)
      return verdict("activation checkpointing + accumulation: micro-batch " + std::to_string(d) +
                         " x " + std::to_string(per_rank / d),
                     checkpointed->at(d));
  }
  j["fits"] = "does not fit";
  j["predicted_peak_bytes"] = static_cast<int64_t>(plain.at(micro));
  return j;
}

}  // namespace

int plan_command(const RunConfig& config, const std::string& device, int64_t memory_limit,
                 bool json, const Registry& registry, std::ostream& out) {
  Session session = open_session(config, device, memory_limit, registry);
  const MemoryPlan plan = make_plan(config, session, 1, std::nullopt);
  const Estimate estimate = estimate_for(config, session, plan);

  // Two sizes without checkpointing and one with fix the lines for the card table.
  const int64_t micro = config.train.batch_size / config.train.accumulation_steps;
  Prober prober(*session.model, session.data, config.optim, *session.meter,
                config.memory.probe_steps, session.device, session.loss,
                session.precision.precision);
  checkpoint_every_segment(*session.model, false);
  const Probe full = prober.train(micro, false);
  const Probe half = prober.train(std::max<int64_t>(1, micro / 2), false);
  Line plain;
  const Estimate at_micro = estimate_for(config, session, [&] {
    MemoryPlan p = plan;
    p.micro_batch = micro;
    p.activation_checkpointing = false;
    return p;
  }());
  plain.per_sample = static_cast<double>(at_micro.activations) / micro;
  if (!full.out_of_memory && !half.out_of_memory && half.micro_batch < micro)
    plain.per_sample =
        static_cast<double>(full.peak_bytes - half.peak_bytes) / (micro - half.micro_batch);
  const Probe& anchor = full.out_of_memory ? half : full;
  plain.fixed = anchor.out_of_memory ? static_cast<double>(at_micro.total() - at_micro.activations)
                                     : anchor.peak_bytes - plain.per_sample * anchor.micro_batch;
  std::optional<Line> checkpointed;
  if (!session.model->segments().empty()) {
    const Probe ck = prober.train(micro, true);
    if (!ck.out_of_memory)
      checkpointed = Line{plain.fixed, std::max(0.0, (ck.peak_bytes - plain.fixed) / micro)};
  }
  // The plan's training step under each precision, side by side: measured and estimated.
  nlohmann::json precisions = nlohmann::json::array();
  for (const Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    Prober under(*session.model, session.data, config.optim, *session.meter,
                 config.memory.probe_steps, session.device, session.loss, p);
    const Probe probe = under.train(plan.micro_batch, plan.activation_checkpointing);
    const Estimate e =
        estimate_peak(*session.model, config.optim, session.data.input_shape, plan.micro_batch,
                      plan.activation_checkpointing, session.device, p);
    precisions.push_back(
        {{"precision", precision_name(p)},
         {"measured_peak_bytes",
          probe.out_of_memory ? nlohmann::json() : nlohmann::json(probe.peak_bytes)},
         {"estimated_peak_bytes", e.total()},
         {"step_seconds", probe.step_seconds},
         {"this_run", p == session.precision.precision}});
  }
  checkpoint_every_segment(*session.model, plan.activation_checkpointing);

  // Evaluation: the state between steps (the training line's fixed part) plus a share per
  // sample, through the measured evaluation of the plan's eval batch.
  const MeasuredPeaks& m = plan.measured;
  const Line eval{plain.fixed, std::max(0.0, (static_cast<double>(m.evaluation) - plain.fixed) /
                                                 static_cast<double>(plan.eval_batch))};
  const int64_t state_bytes = std::max(m.checkpoint_capture, m.resume_loading);

  const int64_t n = session.data.train->size();
  const int64_t steps = (n + plan.global_batch - 1) / plan.global_batch * config.train.epochs;
  const double eta = static_cast<double>(steps) * plan.accumulation_steps * plan.step_seconds;
  nlohmann::json result = plan.to_json();
  result["device"] = session.meter->device_name();
  result["breakdown"] = estimate.to_json();
  result["precisions"] = precisions;
  const ParameterCounts counts = count_parameters(*session.model);
  result["parameters"] = {{"trainable", counts.trainable}, {"total", counts.total}};
  result["lora_layers"] = session.lora_layers;
  result["precision_reason"] = session.precision.reason;
  result["eta_seconds"] = eta;
  result["total_steps"] = steps;
  if (!session.data_stage.empty()) result["data_stage"] = session.data_stage;
  result["cards"] = nlohmann::json::array();
  for (const auto& [name, bytes] : common_cards())
    result["cards"].push_back(card_verdict(name, bytes, config, micro, plain,
                                           checkpointed ? &*checkpointed : nullptr, state_bytes,
                                           eval, plan.eval_batch));
  if (json) {
    out << result.dump() << "\n";
    return 0;
  }
  auto pct = [](int64_t a, int64_t b) { return b ? 100.0 * (a - b) / b : 0.0; };
  char line[256];
  out << "device          " << session.meter->device_name() << ", capacity "
      << format_bytes(plan.capacity_bytes) << " (headroom " << config.memory.headroom * 100
      << "%)\n";
  out << "plan            micro-batch " << plan.micro_batch << " x accumulation "
      << plan.accumulation_steps << " = global batch " << plan.global_batch
      << (plan.activation_checkpointing ? ", activation checkpointing" : "") << "; eval batch "
      << plan.eval_batch << " (" << plan.reason << ")\n";
  out << "peak memory     measured " << format_bytes(plan.measured_peak_bytes)
      << ", the largest of:\n";
  std::snprintf(line, sizeof line, "  training      %s (estimated %s, %+.0f%%)\n",
                format_bytes(m.training).c_str(), format_bytes(estimate.total()).c_str(),
                pct(estimate.total(), m.training));
  out << line;
  out << "  evaluation    " << format_bytes(m.evaluation) << " (eval batch " << plan.eval_batch
      << ")\n";
  out << "  ckpt capture  " << format_bytes(m.checkpoint_capture)
      << " (weights, gradients, optimizer state and the copy a checkpoint takes)\n";
  out << "  resume load   " << format_bytes(m.resume_loading)
      << " (weights and optimizer state with a checkpoint's tensors being loaded)\n";
  if (m.checkpoint_buffers > 0)
    out << "  + ckpt copy   " << format_bytes(m.checkpoint_buffers)
        << " kept between saves, added to training and evaluation (largest: " << m.largest_part()
        << " with it)\n";
  out << "  estimate      parameters+buffers " << format_bytes(estimate.parameters)
      << ", gradients " << format_bytes(estimate.gradients) << ", optimizer state "
      << format_bytes(estimate.optimizer_state) << ", activations "
      << format_bytes(estimate.activations)
      << (estimate.weight_casts
              ? ", autocast's weight copies " + format_bytes(estimate.weight_casts)
              : std::string())
      << "\n";
  out << "parameters      " << counts.trainable << " trainable of " << counts.total
      << (session.lora_layers.empty()
              ? std::string()
              : "; LoRA rank " + std::to_string(config.model.lora.rank) + " on " +
                    std::to_string(session.lora_layers.size()) + " Linear layers (" +
                    session.lora_layers.front() + ", ...)")
      << "\n";
  out << "precision       " << precision_name(session.precision.precision) << " ("
      << session.precision.reason << "); a training step of this plan under each:\n";
  for (const auto& p : precisions) {
    const std::string measured = p["measured_peak_bytes"].is_null()
                                     ? "out of memory"
                                     : format_bytes(p["measured_peak_bytes"].get<int64_t>());
    std::snprintf(line, sizeof line, "  %-4s          peak %s (estimated %s), %.4f s/step%s\n",
                  p["precision"].get<std::string>().c_str(), measured.c_str(),
                  format_bytes(p["estimated_peak_bytes"].get<int64_t>()).c_str(),
                  p["step_seconds"].get<double>(),
                  p["this_run"].get<bool>() ? "  <- this run" : "");
    out << line;
  }
  std::snprintf(line, sizeof line,
                "step time       %.4f s per micro-batch; %lld optimizer steps; ETA %s\n",
                plan.step_seconds, static_cast<long long>(steps), format_duration(eta).c_str());
  out << line;
  for (const auto& staged : session.data_stage) {
    const int64_t files = staged["files"].get<int64_t>();
    std::snprintf(line, sizeof line, "data staged     %s: %s, %lld file%s; %s copied in %.2f s\n",
                  staged["copy"].get<std::string>().c_str(),
                  format_bytes(staged["bytes"].get<int64_t>()).c_str(),
                  static_cast<long long>(files), files == 1 ? "" : "s",
                  format_bytes(staged["copied_bytes"].get<int64_t>()).c_str(),
                  staged["seconds"].get<double>());
    out << line;
  }
  out << "\ncommon cards (predicted):\n";
  for (const auto& card : result["cards"]) {
    std::snprintf(line, sizeof line, "  %-34s %s\n", card["card"].get<std::string>().c_str(),
                  card["fits"].get<std::string>().c_str());
    out << line;
  }
  return 0;
}

}  // namespace gpurun

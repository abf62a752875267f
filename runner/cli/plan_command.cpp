#include "cli/plan_command.h"
#include "cli/plan_placement.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <ostream>

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include "checkpoint/interval.h"
#include "config/paths.h"
#include "config/rules.h"
#include "forecast/forecast.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "memory/meter.h"
#include "memory/placement.h"
#include "memory/rank_state.h"
#include "model/activation_checkpointing.h"
#include "model/fine_tune.h"
#include "model/hf_config.h"
#include "model/precision.h"
#include "report/reporter.h"
#include "train/device.h"
#include "train/run_setup.h"
#include "util/clock.h"
#include "util/units.h"

namespace gpurun {
namespace {

/// The run's size and save policy for the forecast; the memory lines are the caller's.
Workload base_workload(const RunConfig& c, const Session& session, const Estimate& estimate,
                       const std::string& precision) {
  Workload w;
  w.global_batch = c.train.batch_size;
  w.accumulation = c.train.accumulation_steps;
  w.eval_batch = c.train.eval_batch_size;
  w.precision = precision;
  w.headroom = c.memory.headroom;
  const double forward = estimate.forward_flops_per_sample * static_cast<double>(w.global_batch);
  w.flops_per_step = 3.0 * forward;
  w.flops_per_step_checkpointed = 4.0 * forward;
  const int64_t n = session.data.train->size();
  w.steps_per_epoch = (n + w.global_batch - 1) / w.global_batch;
  w.optimizer_steps = w.steps_per_epoch * c.train.epochs;
  // every_minutes auto (NaN): Young/Daly's interval for the assumed save cost and the MTBF.
  w.checkpoint_every_seconds =
      std::isnan(c.checkpoint.every_minutes)
          ? young_daly_seconds(kAssumedSaveSeconds, 3600.0 * c.checkpoint.mtbf_hours)
          : 60.0 * c.checkpoint.every_minutes;
  w.checkpoint_every_steps = c.checkpoint.every_steps;
  return w;
}

/// result["cards"] from `w` on every card of `cards`.
void add_cards(nlohmann::json& result, const Workload& w, const std::vector<Card>& cards,
               double deadline_hours) {
  result["cards"] = nlohmann::json::array();
  for (const Card& card : cards)
    result["cards"].push_back(forecast(card, w, deadline_hours).to_json(card));
  result["deadline_hours"] = deadline_hours;
  result["assumed_utilisation"] = kAssumedUtilisation;
}

/// The most resident memory this process has had, in bytes.
int64_t host_peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
}

std::string hours_text(const nlohmann::json& v) {
  return v.is_null() ? "-" : format_duration(3600.0 * v.get<double>());
}

std::string step_text(const nlohmann::json& v) {
  if (v.is_null()) return "-";
  const double seconds = v.get<double>();
  char b[32];
  if (seconds < 1)
    std::snprintf(b, sizeof b, "%.3f ms", 1e3 * seconds);
  else
    std::snprintf(b, sizeof b, "%.2f s", seconds);
  return b;
}

std::string cost_text(const nlohmann::json& v) {
  if (v.is_null()) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v.get<double>());
  return b;
}

void print_cards(std::ostream& out, const nlohmann::json& result) {
  char line[512];
  out << "\ncards, predicted (step: an optimizer step's FLOPs counted from the model at "
      << static_cast<int>(kAssumedUtilisation * 100)
      << "% of the card's throughput;\n"
         "  a small model is bound by kernel launches instead and runs slower. cards: the fewest "
         "to rent that hold\n  the run (1, 2, 4, 8 on a box, then boxes of 8), whose step, "
         "time to finish and cost (all cards)\n  follow. lost/reclaim: the most work a reclaim "
         "loses at the checkpoint interval. deadline: cards\n  for DDP to finish within "
      << result["deadline_hours"].get<double>() << " h):\n";
  std::snprintf(line, sizeof line, "  %-16s %10s  %-13s %5s %10s %10s %9s %12s %8s  %s\n", "card",
                "memory", "one card", "cards", "step", "to finish", "cost", "lost/reclaim",
                "deadline", "plan");
  out << line;
  for (const auto& c : result["cards"]) {
    const nlohmann::json& to_fit = c["to_fit"];
    const bool fits = to_fit.is_object();
    const std::string deadline = c["cards_for_deadline"].is_null()
                                     ? "-"
                                     : std::to_string(c["cards_for_deadline"].get<int64_t>());
    std::string plan =
        fits ? to_fit["placement"].get<std::string>() + ", " + to_fit["plan"].get<std::string>()
             : c["plan"].get<std::string>();
    const nlohmann::json& next = c["next_size_up"];
    if (next.is_object())
      plan += "; next size up " + std::to_string(next["cards"].get<int64_t>()) +
              " cards: " + step_text(next["step_seconds"]) + " a step, " +
              hours_text(next["hours_to_finish"]) + ", cost " + cost_text(next["cost_to_finish"]);
    if (!c["note"].get<std::string>().empty()) plan += "; " + c["note"].get<std::string>();
    // The plan and its note after the columns: they may be longer than any buffer.
    std::snprintf(line, sizeof line, "  %-16s %10s  %-13s %5s %10s %10s %9s %12s %8s  ",
                  c["name"].get<std::string>().c_str(),
                  format_bytes(c["memory_bytes"].get<int64_t>()).c_str(),
                  c["fits"].get<std::string>().c_str(),
                  fits ? std::to_string(to_fit["cards"].get<int64_t>()).c_str() : "-",
                  step_text(fits ? to_fit["step_seconds"] : nlohmann::json()).c_str(),
                  hours_text(fits ? to_fit["hours_to_finish"] : nlohmann::json()).c_str(),
                  cost_text(fits ? to_fit["cost_to_finish"] : nlohmann::json()).c_str(),
                  hours_text(c["lost_hours_per_reclaim"]).c_str(), deadline.c_str());
    out << line << plan << "\n";
  }
}

/// The plan from the estimate alone: the model built without its weights, nothing run.
/// `data` and `shape`: the run's data and what probe_model_shape() learned for it.
int estimate_plan(const RunConfig& config, const std::string& device, bool json,
                  const Registry& registry, const PlanOptions& options, std::ostream& out,
                  const std::string& why, DatasetSplits data, const ModelShape& shape,
                  std::chrono::steady_clock::time_point start, int64_t capacity_bytes) {
  Session session = open_estimate_session(config, device, registry, std::move(data), shape);
  // The cards are GPUs: `auto` is bf16 on every card of compute capability >= 8 (the bundled
  // ones), and a model that describes its activations is estimated under CUDA's autocast.
  const bool automatic = config.train.precision == "auto";
  const Precision precision = automatic ? Precision::kBf16 : session.precision.precision;
  if (automatic) session.precision.reason = "auto: bf16 on a card of compute capability >= 8";
  const c10::Device target =
      session.model->activation_estimate() ? c10::Device(c10::kCUDA) : session.device;
  // The micro-batch of a rank of --world-size.
  const int64_t micro = std::max<int64_t>(
      1, config.train.batch_size / config.train.accumulation_steps / options.world_size);
  const Estimate plain = estimate_peak(*session.model, config.optim, session.data.input_shape,
                                       micro, false, target, precision);
  const Estimate ck = estimate_peak(*session.model, config.optim, session.data.input_shape, micro,
                                    true, target, precision);
  // Per rank under the placement chosen for this device at --world-size.
  const StateShape state_parts = state_shape(*session.model);
  const Estimate smallest = smallest_of(config, session, plain, ck, micro);
  const PlacementChoice choice =
      place_optimizer(config, state_parts, smallest, precision, options.world_size, capacity_bytes);
  if (!choice.note.empty()) spdlog::info("{}", choice.note);
  const Estimate rank =
      rank_state(state_parts, config.optim, precision, choice.placement, options.world_size);
  Workload w = base_workload(config, session, plain, precision_name(precision));
  const auto [one, one_ck] = per_sample(config, session, plain, ck, micro);
  w.ranks = rank_lines(config, state_parts, one, one_ck, precision, {});
  add_levers(w, config, state_parts, shape.lora_state, one, one_ck, precision, {});
  const ParameterCounts counts = count_parameters(*session.model);
  nlohmann::json result = {
      {"estimate_only", true},
      {"why", why},
      {"device", session.device.str()},
      {"estimated_for", target.is_cuda() ? "cuda" : session.device.str()},
      {"precision", precision_name(precision)},
      {"precision_reason", session.precision.reason},
      {"micro_batch", micro},
      {"global_batch", config.train.batch_size},
      {"breakdown", plain.with_state(rank).to_json()},
      {"breakdown_checkpointed", ck.with_state(rank).to_json()},
      {"world_size", options.world_size},
      {"shard", choice.placement.shard},
      {"offload", choice.placement.offload},
      {"placement", placement_name(choice.placement)},
      {"shard_reason", choice.reason},
      {"host_bytes", rank.host_bytes},
      {"modes", modes_json(config, state_parts, smallest, precision, options.world_size)},
      {"parameters", {{"trainable", counts.trainable}, {"total", counts.total}}},
      {"lora_layers", session.lora_layers},
      {"total_steps", w.optimizer_steps}};
  add_cards(result, w, options.cards, options.deadline_hours);
  result["seconds"] = seconds_since(start);
  result["host_peak_rss_bytes"] = host_peak_rss_bytes();
  if (json) {
    out << result.dump() << "\n";
    return 0;
  }
  out << "estimate only   " << why << "; nothing was run or allocated\n";
  out << "parameters      " << counts.trainable << " trainable of " << counts.total << "\n";
  out << "precision       " << precision_name(precision) << " (" << session.precision.reason
      << ")\n";
  print_placement(out, placement_name(choice.placement), options.world_size, choice.reason,
                  rank.host_bytes);
  for (const Estimate& e : {plain.with_state(rank), ck.with_state(rank)}) {
    out << (e.activations == plain.activations ? "training step   " : "  checkpointed  ")
        << "micro-batch " << micro << ", a rank: " << format_bytes(e.total())
        << " = parameters+buffers " << format_bytes(e.parameters) << ", gradients "
        << format_bytes(e.gradients) << ", optimizer state " << format_bytes(e.optimizer_state)
        << (e.gradient_slice ? ", gradient slice " + format_bytes(e.gradient_slice) : "")
        << ", autocast copies " << format_bytes(e.weight_casts) << ", activations "
        << format_bytes(e.activations) << "\n";
  }
  print_cards(out, result);
  return 0;
}

}  // namespace

int plan_command(const RunConfig& config, const std::string& device, int64_t memory_limit,
                 bool json, const Registry& registry, const PlanOptions& options,
                 std::ostream& out) {
  const auto start = std::chrono::steady_clock::now();
  // A world size that does not split the global batch is the configuration's, not the memory's:
  // refused first (exit 2), as the launcher refuses it.
  if (const std::string problem = detail::batch_split_problem(config, options.world_size);
      !problem.empty())
    throw ConfigError("--world-size " + std::to_string(options.world_size) + ": " + problem);
  // The model's size and its estimate, learned without its weights for this device and
  // precision, and the data it was learned for: once, for whichever way the plan goes. A
  // TorchScript module is refused by the estimate.
  DatasetSplits data;
  ModelShape shape;
  if (config.model.torchscript.empty()) {
    data = registry.make_dataset(run_data(config, true));
    const c10::Device target = select_device(device, 0);
    shape = probe_model_shape(config, registry, data, target,
                              resolve_precision(config.train.precision, target).precision);
  }
  const int64_t limit = memory_limit_bytes(config, memory_limit);
  auto from_estimate = [&](const std::string& why) {
    // The capacity the placement is chosen for: this device's, as the run's would be.
    const int64_t capacity =
        limit > 0 ? limit : make_meter(select_device(device, 0), 0)->capacity_bytes();
    return estimate_plan(config, device, json, registry, options, out, why, data, shape, start,
                         capacity);
  };
  if (options.estimate_only) return from_estimate("--estimate-only");
  if (config.model.name == "hf" && !hf_folder_has_weights(config_path(config, config.model.path)))
    return from_estimate("model.path holds config.json without weights");
  // Weights too large to build here (they are initialised in host memory first, whatever the
  // device) are not built.
  if (shape.error.empty() && (shape.weight_bytes > physical_memory_bytes() / 4 ||
                              (limit > 0 && shape.weight_bytes > limit))) {
    spdlog::info("the model's weights alone are {}: planning from the estimate",
                 format_bytes(shape.weight_bytes));
    return from_estimate("the weights alone do not fit this machine or --memory-limit");
  }
  std::optional<Session> opened;
  try {
    opened.emplace(open_session(config, device, memory_limit, registry, 0,
                                config.model.torchscript.empty() ? &shape : nullptr,
                                options.world_size));
  } catch (const WeightsDoNotFit& e) {
    spdlog::info("{}: planning from the estimate", e.what());
    return from_estimate("the weights alone do not fit this device");
  } catch (const RunDoesNotFit& e) {
    // Nothing was built: the estimate alone says the smallest step exceeds this device.
    spdlog::info("{}: planning from the estimate", e.what());
    return from_estimate(e.what());
  }
  Session& session = *opened;
  std::optional<MemoryPlan> made;
  try {
    made = make_plan(config, session, options.world_size, std::nullopt);
  } catch (const ConfigError& e) {
    // The run does not fit here; the cards may still take it.
    spdlog::info("{}: planning from the estimate", e.what());
    opened.reset();  // the meter and its limit go with the session
    return from_estimate(std::string("the run does not fit this device: ") + e.what());
  }
  const MemoryPlan& plan = *made;
  // Per rank, under the plan's placement.
  const Precision precision = session.precision.precision;
  const StateShape state_parts = state_shape(*session.model);
  OptimizerPlacement placement;
  placement.shard = plan.shard;
  placement.master_weights = uses_master_weights(config, precision);
  placement.offload = plan.offload;
  const Estimate rank =
      rank_state(state_parts, config.optim, precision, placement, plan.world_size);
  const Estimate estimate = estimate_for(config, session, plan).with_state(rank);

  const Estimate at_one = estimate_at(config, session, 1, false);
  const Estimate at_one_ck = estimate_at(config, session, 1, true);
  const auto [one, one_ck] = per_sample(config, session, at_one, at_one_ck, 1);
  // One step time, defined once: seconds per optimizer step of this plan (its micro-batches).
  const double step_seconds = plan.step_seconds * static_cast<double>(plan.accumulation_steps);
  // The plan's training step under each precision: the estimate; measured for this run's
  // precision (the plan's own probe), and for the others only with --probe-precisions.
  nlohmann::json precisions = nlohmann::json::array();
  for (const Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    const bool this_run = p == session.precision.precision;
    nlohmann::json measured_peak, measured_step;
    if (this_run) {
      measured_peak = plan.measured.training;
      measured_step = step_seconds;
    } else if (options.probe_precisions) {
      spdlog::info("probing the plan's step under {} ({} steps)", precision_name(p),
                   config.memory.probe_steps);
      Prober under(*session.model, session.data, config.optim, *session.meter,
                   config.memory.probe_steps, session.device, session.loss, p);
      const Probe probe = under.train(plan.micro_batch, plan.activation_checkpointing);
      if (!probe.out_of_memory) measured_peak = probe.peak_bytes;
      measured_step = probe.step_seconds * static_cast<double>(plan.accumulation_steps);
    }
    const Estimate e =
        estimate_peak(*session.model, config.optim, session.data.input_shape, plan.micro_batch,
                      plan.activation_checkpointing, session.device, p);
    precisions.push_back({{"precision", precision_name(p)},
                          {"measured_peak_bytes", measured_peak},
                          {"estimated_peak_bytes", e.total()},
                          {"step_seconds", measured_step},
                          {"this_run", this_run}});
  }
  checkpoint_every_segment(*session.model, plan.activation_checkpointing);

  // The card table's lines: each card's placement by the estimate, moved by what this plan
  // measured beyond the estimate of its own placement (no probe beyond the plan's own): the
  // training step's fixed part (the measured peak less the estimate's activations at the
  // plan's micro-batch), evaluation per sample, checkpoint capture and resume loading.
  const MeasuredPeaks& m = plan.measured;
  const RankLines own = rank_lines(config, state_parts, one, one_ck, precision, {})(
      plan.world_size, plan.capacity_bytes);
  const double slope =
      static_cast<double>((plan.activation_checkpointing ? at_one_ck : at_one).activations);
  LineCorrection correction;
  correction.training = static_cast<double>(m.training) -
                        slope * static_cast<double>(plan.micro_batch) - own.plain.fixed;
  correction.eval_per_sample =
      std::max(0.0, (static_cast<double>(m.evaluation) - own.eval.fixed - correction.training) /
                        static_cast<double>(plan.eval_batch));
  correction.state = static_cast<double>(std::max(m.checkpoint_capture, m.resume_loading)) -
                     static_cast<double>(own.state_bytes);

  const int64_t n = session.data.train->size();
  const int64_t steps = (n + plan.global_batch - 1) / plan.global_batch * config.train.epochs;
  const double eta = static_cast<double>(steps) * step_seconds;
  nlohmann::json result = plan.to_json();
  result["device"] = session.meter->device_name();
  result["breakdown"] = estimate.to_json();
  result["placement"] = placement_name(placement);
  result["modes"] = modes_json(config, state_parts, estimate, precision, plan.world_size);
  result["precisions"] = precisions;
  const ParameterCounts counts = count_parameters(*session.model);
  result["parameters"] = {{"trainable", counts.trainable}, {"total", counts.total}};
  result["lora_layers"] = session.lora_layers;
  result["precision_reason"] = session.precision.reason;
  result["eta_seconds"] = eta;
  result["optimizer_step_seconds"] = step_seconds;
  result["seconds"] = seconds_since(start);
  result["total_steps"] = steps;
  if (!session.data_stage.empty()) result["data_stage"] = session.data_stage;
  Workload w =
      base_workload(config, session, estimate, precision_name(session.precision.precision));
  w.eval_batch = plan.eval_batch;
  w.ranks = rank_lines(config, state_parts, one, one_ck, precision, correction);
  add_levers(w, config, state_parts, shape.lora_state, one, one_ck, precision, correction);
  add_cards(result, w, options.cards, options.deadline_hours);
  // What this machine reached on the counted FLOPs: the forecast's utilisation, for comparison.
  if (plan.step_seconds > 0)
    result["flops_per_second_here"] = estimate.forward_flops_per_sample * 3.0 *
                                      static_cast<double>(plan.micro_batch) / plan.step_seconds;
  result["host_peak_rss_bytes"] = host_peak_rss_bytes();
  if (json) {
    out << result.dump() << "\n";
    return 0;
  }
  auto pct = [](int64_t a, int64_t b) { return b ? 100.0 * (a - b) / b : 0.0; };
  char line[256];
  out << "device          " << session.meter->device_name() << ", capacity "
      << format_bytes(plan.capacity_bytes) << " (headroom " << config.memory.headroom * 100
      << "%)\n";
  print_placement(out, placement_name(placement), plan.world_size, plan.shard_reason,
                  plan.host_bytes);
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
    const bool probed = !p["step_seconds"].is_null();
    std::string measured = "not probed (--probe-precisions)";
    if (probed)
      measured = p["measured_peak_bytes"].is_null()
                     ? "out of memory"
                     : "measured " + format_bytes(p["measured_peak_bytes"].get<int64_t>());
    char step[64] = "";
    if (probed)
      std::snprintf(step, sizeof step, ", %.4f s per optimizer step",
                    p["step_seconds"].get<double>());
    std::snprintf(line, sizeof line, "  %-4s          estimated %s, %s%s%s\n",
                  p["precision"].get<std::string>().c_str(),
                  format_bytes(p["estimated_peak_bytes"].get<int64_t>()).c_str(), measured.c_str(),
                  step, p["this_run"].get<bool>() ? "  <- this run" : "");
    out << line;
  }
  std::snprintf(line, sizeof line,
                "step time       %.4f s per optimizer step (%lld micro-batch%s of %lld, measured); "
                "%lld optimizer steps; ETA %s\n",
                step_seconds, static_cast<long long>(plan.accumulation_steps),
                plan.accumulation_steps == 1 ? "" : "es", static_cast<long long>(plan.micro_batch),
                static_cast<long long>(steps), format_duration(eta).c_str());
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
  print_cards(out, result);
  return 0;
}

}  // namespace gpurun

// What a run left alone overnight needs from the trainer (train/trainer_loop.h): its cost
// ledger, the budget's stop, and the messages its events send (notify/notifier.h).
#include <algorithm>
#include <csignal>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/interval.h"
#include "forecast/cards.h"
#include "gpurun/errors.h"
#include "memory/planner.h"
#include "notify/notifier.h"
#include "report/metrics_tail.h"
#include "train/trainer_loop.h"
#include "util/signals.h"

namespace gpurun::detail {

using json = nlohmann::json;

CostLedger Trainer::make_ledger() const {
  const auto price =
      price_for(config_.cost.price_per_hour, session_.meter->device_name(), bundled_cards());
  return CostLedger(world_, price ? std::optional<double>(price->first) : std::nullopt,
                    price ? price->second : std::string(), config_.cost.budget);
}

void Trainer::restore_ledger(const CheckpointMeta& meta) {
  ledger_.restore(meta.extra.value("cost", json()));
  if (rank_ != 0) return;  // rank 0 keeps the ledger that is saved and checked
  // The attempts' own last words: the time after their last checkpoint, and the attempts that
  // left none that was loaded. The newest 4 MiB of events hold every attempt since it.
  const std::string path = run_dir_or_default(options_) + "/metrics.jsonl";
  for (const std::string& line : complete_lines_in_tail(path, 4 << 20)) {
    if (line.find("\"done\"") == std::string::npos) continue;
    const json done = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (done.is_object() && done.value("event", "") == "done" && done.contains("attempt"))
      ledger_.add_ended(done["attempt"]);
  }
}

void Trainer::watch_events() {
  if (rank_ != 0) return;
  // The save the previous process of this run measured, until this one measures its own.
  if (const auto last =
          last_event_in_tail(run_dir_or_default(options_) + "/metrics.jsonl", "checkpoint"))
    save_seconds_ = last->value("build_seconds", 0.0) + last->value("write_seconds", 0.0);
  Notifier* notifier = options_.notifier;
  // Keys make each message once per run (its run_id), whatever restarts in between: a
  // `finished` sent before a kill is not sent again by the process that resumes.
  reporter_.set_observer([this, notifier](const std::string& name, const json& line,
                                          const json& status) {
    if (name == "checkpoint") {
      save_seconds_ = line.value("build_seconds", 0.0) + line.value("write_seconds", 0.0);
      return;
    }
    if (!notifier) return;
    if (name == "plan") {
      const bool resumed = line.value("global_step", int64_t{0}) > 0;
      notifier->send("started", status, {{"resumed", resumed}}, "started:" + run_id_);
    } else if (name == "checkpoint_failed") {
      notifier->send("checkpoint_failed", status,
                     {{"step", line.value("global_step", int64_t{0})},
                      {"error", line.value("error", std::string())},
                      {"failures_in_a_row", line.value("failures_in_a_row", 1)},
                      {"max_failures", line.value("max_failures", 0)},
                      {"final", line.value("final", false)},
                      {"stops", line.value("stops", false)}},
                     fmt::format("checkpoint_failed:{}:{}", run_id_, line.value("global_step", 0)));
    } else if (name == "signal") {
      // A notice's event comes after its save; a signal's before: either is the first word.
      const std::string cause =
          line.contains("notice")
              ? line["notice"].value("cloud", std::string("cloud")) + " preemption notice"
              : signal_name(line.value("signal", SIGTERM));
      // status.json's step is the last step event's: the stop is at this one.
      notifier->send("preempted", status,
                     {{"cause", cause}, {"step", line.value("global_step", int64_t{0})}},
                     fmt::format("preempted:{}:{}", run_id_, line.value("global_step", 0)));
    } else if (name == "done") {
      const int code = line.value("exit_code", 1);
      if (code == kExitOk) {
        json details = {{"reason", line.value("reason", std::string("finished"))}};
        if (line.contains("early_stop")) details["early_stop"] = line["early_stop"];
        // With its step: a finished run that a resume extends (more epochs, more patience)
        // finishes again, later.
        notifier->send("finished", status, details,
                       fmt::format("finished:{}:{}", run_id_, line.value("global_step", 0)));
      } else if (code == kExitBudget) {
        notifier->send("budget", status, {},
                       fmt::format("budget:{}:{}", run_id_, line.value("global_step", 0)));
      }
      // A failure is the launcher's or the supervisor's to send: only they know whether a
      // restart follows (launch/launcher.cpp).
    }
  });
}

void Trainer::check_budget_at_start(const LoadedCheckpoint& loaded) {
  if (config_.cost.budget <= 0 || !ledger_.spent()) return;
  double step = 0;
  if (loaded.info.manifest.contains("plan")) {
    const MemoryPlan saved = MemoryPlan::from_json(loaded.info.manifest["plan"]);
    step = saved.step_seconds * static_cast<double>(saved.accumulation_steps);
  }
  if (!ledger_.would_pass_budget(step + kAssumedSaveSeconds)) return;
  const std::string message = fmt::format(
      "cost.budget {:.2f} leaves no room for another step and a save: {:.2f} is spent over {} "
      "attempt(s) ({:.1f} h); to go on, raise it: --resume --set cost.budget=...",
      config_.cost.budget, *ledger_.spent(), ledger_.summary()["attempts"].get<int64_t>(),
      ledger_.seconds() / 3600);
  // Its own `done`, so that the next resume's ledger counts this attempt's time too; the
  // run's status stays the stop's.
  if (rank_ == 0)
    reporter_.event("done", {{"exit_code", kExitBudget},
                             {"reason", "budget"},
                             {"error", message},
                             {"global_step", loaded.meta.global_step},
                             {"attempt", ledger_.this_attempt()}});
  throw BudgetReached(message);
}

double Trainer::seconds_to_next_save() const {
  const double step = last_step_seconds_ > 0
                          ? last_step_seconds_
                          : plan_.step_seconds * static_cast<double>(plan_.accumulation_steps);
  const double save = save_seconds_.load();
  // The epoch's last step is followed by its evaluation before its checkpoint.
  const bool ends_epoch = position_ + plan_.global_batch >= data_.train->size();
  return step + (ends_epoch ? eval_seconds_ : 0) + (save > 0 ? save : kAssumedSaveSeconds);
}

bool Trainer::budget_due() const {
  return rank_ == 0 && ledger_.would_pass_budget(seconds_to_next_save());
}

void Trainer::stop_if_over_budget(std::optional<bool> agreed) {
  if (config_.cost.budget <= 0) return;
  bool due = budget_due();
  if (comm_)
    due = agreed ? *agreed : comm_->all_reduce({due ? 1.0 : 0.0}, Collectives::Op::kMax)[0] > 0;
  if (due) stop_at_budget();
}

void Trainer::stop_at_budget() {
  reporter_.end_progress();
  const double spent = ledger_.spent().value_or(0);
  if (global_step_ == 0) {
    // Not one step trained, in this attempt or before it: there is nothing to save.
    throw BudgetReached(fmt::format(
        "stopped at cost.budget {:.2f} before the first step: {:.2f} is spent, and the first step "
        "and a save (about {:.1f} s at {:.2f} an hour) would pass it; nothing was trained or "
        "saved; raise cost.budget",
        config_.cost.budget, spent, seconds_to_next_save(),
        ledger_.rate_per_second().value_or(0) * 3600));
  }
  if (rank_ == 0)
    spdlog::warn(
        "cost: {:.2f} spent of cost.budget {:.2f}, and the next step and a save (about {:.1f} s "
        "at {:.2f} an hour) would pass it; {} global step {} and stopping",
        spent, config_.cost.budget, seconds_to_next_save(),
        ledger_.rate_per_second().value_or(0) * 3600,
        checkpointer_.saved(global_step_) ? "already saved at" : "saving at", global_step_);
  if (!checkpointer_.saved(global_step_)) save("budget", epoch_, position_);
  checkpointer_.finish(global_step_);  // safe in --ckpt, the network tier included
  if (comm_) comm_->barrier();
  throw BudgetReached(fmt::format(
      "stopped at cost.budget {:.2f}: {:.2f} spent over {} attempt(s); the checkpoint of global "
      "step {} is complete; to go on, resume with a larger budget: --resume --set "
      "cost.budget=...",
      config_.cost.budget, spent, ledger_.summary()["attempts"].get<int64_t>(), global_step_));
}

}  // namespace gpurun::detail

// The message a run sends to a person (README "Notifications"): one JSON object, the same for
// the webhook's POST body and the command's stdin, with a `text` field that Slack's and
// Discord's incoming webhooks and ntfy show as it is:
//
//   {"text": "gpurun exp1 on box-3: finished: 10 epochs, 4690 steps, eval loss 0.3012, ...",
//    "content": <text again, Discord's field>, "event": "finished", "run": "exp1",
//    "host": "box-3", "time": 1765000000.5, "step": 4690, "total_steps": 4690, "epoch": 10,
//    "epochs": 10, "loss": 0.29, "eval_loss": 0.3012, "eval_accuracy": 0.8911,
//    "elapsed_seconds": 11520, "cost": {...}, "checkpoint": "/mnt/nas/exp1/ckpt-...",
//    "error": <the last error's first line, failures only>, ...}
//
// Fields that are not known are left out. No Torch headers: the supervisor sends messages too.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpurun {

/// The message of `event` for the run `run_name` on `host`: `status` is what status.json holds
/// (epoch 0-based, global_step, total_steps, epochs, loss, eval_loss, eval_accuracy, cost,
/// last_checkpoint, error, ...) and `details` the event's own fields, which win (reason,
/// signal, error, stalled_seconds, restarts, ...). Adds `time` (now) and `text`.
nlohmann::json notice_message(const std::string& event, const std::string& run_name,
                              const std::string& host, const nlohmann::json& status,
                              const nlohmann::json& details);

/// The message's one line of text, e.g. "gpurun exp1 on box-3: preempted (SIGTERM) at step
/// 1200 of 4690 (epoch 3/10); saved; 1.2 h, 3.60 spent".
std::string notice_text(const nlohmann::json& message);

/// A cost summary (train/cost_ledger.h CostLedger::summary()) in words: "3.21 spent of a
/// budget of 25.00 over 2 attempts, 1.1 h at 2.40 an hour (card H100 80GB)", or "1.1 h over 2
/// attempts; no price known (cost.price_per_hour)".
std::string describe_cost(const nlohmann::json& cost);

/// The first line of `error`, at most 300 characters.
std::string first_line(const std::string& error);

}  // namespace gpurun

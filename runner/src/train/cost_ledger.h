// What a run has cost over all its attempts (README "Cost and budget"): each attempt is one
// process that trained (a first start, a resume, a supervised restart), timed from the
// process's own start (/proc/self/stat, so that loading LibTorch and the data counts: the box
// was paid for) to now. The attempts before this one come from the checkpoint the run resumed
// from, which records them all at every save; the time between attempts is not counted (the
// box was gone). The rate is cost.price_per_hour, else the price of the bundled card whose
// name the device's name matches, times the world size.
//
//   spent = sum over attempts of seconds / 3600 * ranks * price_per_hour
//
// An attempt that stopped (a signal, the budget, a failure) is counted up to its `done` event
// when the run directory holds it; one killed outright (SIGKILL, a lost machine) up to its last
// checkpoint: what came after was not recorded anywhere that survived it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpurun {

struct Card;

class CostLedger {
 public:
  /// One attempt: its start (Unix s), its length (s), its world size and its price per rank
  /// and hour (nullopt: unknown).
  struct Attempt {
    double start = 0;
    double seconds = 0;
    int64_t ranks = 1;
    std::optional<double> price_per_hour;
  };

  /// This attempt: `ranks` processes at `price_per_hour` each (nullopt: unknown), started when
  /// this process started. `budget` 0: none.
  CostLedger(int64_t ranks, std::optional<double> price_per_hour, std::string price_source,
             double budget);

  /// The earlier attempts, as to_json() recorded them in a checkpoint ("attempts"); a
  /// checkpoint without them (an older gpurun) leaves none. Malformed entries are skipped.
  void restore(const nlohmann::json& saved);

  /// An ended attempt's own last word (this_attempt() of its `done` event), given in the order
  /// of the events: an attempt restored from the checkpoint (same start) takes its seconds when
  /// longer (the checkpoint recorded it before the stop's drain and copy); an attempt that
  /// started after the last one known and before this one, and saved no checkpoint that was
  /// loaded (a second Ctrl-C, a resume refused for its budget), is added with its own ranks and
  /// price (this attempt's when it gives none). Ignored without a restored attempt, or when
  /// malformed.
  void add_ended(const nlohmann::json& attempt);

  /// {start, seconds, ranks, price_per_hour (when known)} of this attempt up to now, for the
  /// `done` event.
  nlohmann::json this_attempt() const;

  /// For the checkpoint: {"attempts": [...earlier, this one up to now]}.
  nlohmann::json to_json() const;

  /// Seconds over every attempt, this one up to now.
  double seconds() const;
  /// Money spent over every attempt; nullopt when no attempt's price is known.
  std::optional<double> spent() const;
  /// This attempt's rate, money per second; nullopt when its price is unknown.
  std::optional<double> rate_per_second() const;
  double budget() const { return budget_; }

  /// Whether going on for `seconds_ahead` more would spend more than the budget (false without
  /// a budget or a price).
  bool would_pass_budget(double seconds_ahead) const;

  /// For status.json, the step events and the messages: {seconds, attempts, spent,
  /// price_per_hour (the run's: ranks x per rank), price_source, budget}; unknown ones null.
  nlohmann::json summary() const;

  /// This process's start (Unix s), from /proc/self/stat's start time; now when unreadable.
  static double process_start_unix();

 private:
  std::vector<Attempt> earlier_;
  Attempt current_;
  std::string price_source_;
  double budget_;
};

/// cost.price_per_hour when > 0 ("cost.price_per_hour"), else the price of the card of `cards`
/// whose name's words all appear in `device_name` (the longest such name: "A100 80GB" over
/// "A100"), with its source ("card H100 80GB"); nullopt when neither.
std::optional<std::pair<double, std::string>> price_for(double configured,
                                                        const std::string& device_name,
                                                        const std::vector<Card>& cards);

}  // namespace gpurun

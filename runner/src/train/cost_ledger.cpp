#include "train/cost_ledger.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include "forecast/cards.h"
#include "util/clock.h"

namespace gpurun {
namespace {

using json = nlohmann::json;

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::string word;
  for (char c : text + " ") {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!word.empty()) {
      out.push_back(word);
      word.clear();
    }
  }
  return out;
}

double attempt_cost(const CostLedger::Attempt& a) {
  return a.price_per_hour ? a.seconds / 3600 * static_cast<double>(a.ranks) * *a.price_per_hour : 0;
}

}  // namespace

double CostLedger::process_start_unix() {
  // Field 22 of /proc/self/stat: the start in clock ticks after boot; CLOCK_BOOTTIME is the
  // same clock, so that now less the process's age is its start to 1/CLK_TCK.
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the command name may hold spaces
  timespec boot{};
  if (paren == std::string::npos || clock_gettime(CLOCK_BOOTTIME, &boot) != 0)
    return unix_seconds();
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i != 22) continue;
    const double ticks = std::stod(field);
    const double age = static_cast<double>(boot.tv_sec) + boot.tv_nsec / 1e9 -
                       ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
    return unix_seconds() - std::max(0.0, age);
  }
  return unix_seconds();
}

CostLedger::CostLedger(int64_t ranks, std::optional<double> price_per_hour,
                       std::string price_source, double budget)
    : price_source_(std::move(price_source)), budget_(budget) {
  current_.start = process_start_unix();
  current_.ranks = std::max<int64_t>(1, ranks);
  current_.price_per_hour = price_per_hour;
}

void CostLedger::restore(const json& saved) {
  earlier_.clear();
  if (!saved.is_object() || !saved.contains("attempts") || !saved["attempts"].is_array()) return;
  for (const json& a : saved["attempts"]) {
    if (!a.is_object() || !a.contains("seconds") || !a["seconds"].is_number()) continue;
    Attempt attempt;
    attempt.start = a.value("start", 0.0);
    attempt.seconds = std::max(0.0, a["seconds"].get<double>());
    attempt.ranks = std::max<int64_t>(1, a.value("ranks", int64_t{1}));
    if (a.contains("price_per_hour") && a["price_per_hour"].is_number())
      attempt.price_per_hour = a["price_per_hour"].get<double>();
    earlier_.push_back(attempt);
  }
}

void CostLedger::add_ended(const json& attempt) {
  if (earlier_.empty() || !attempt.is_object() || !attempt.contains("start") ||
      !attempt["start"].is_number() || !attempt.contains("seconds") ||
      !attempt["seconds"].is_number())
    return;
  const double start = attempt["start"].get<double>();
  const double seconds = std::max(0.0, attempt["seconds"].get<double>());
  // Starts are the same process's when within a millisecond (they are written as read).
  for (Attempt& known : earlier_) {
    if (std::abs(start - known.start) > 1e-3) continue;
    known.seconds = std::max(known.seconds, seconds);
    return;
  }
  if (start <= earlier_.back().start || start >= current_.start - 1e-3) return;
  Attempt ended;
  ended.start = start;
  ended.seconds = seconds;
  ended.ranks = std::max<int64_t>(1, attempt.value("ranks", current_.ranks));
  ended.price_per_hour = attempt.contains("price_per_hour") && attempt["price_per_hour"].is_number()
                             ? std::optional<double>(attempt["price_per_hour"].get<double>())
                             : current_.price_per_hour;
  earlier_.push_back(ended);
}

json CostLedger::this_attempt() const {
  json out = {{"start", current_.start},
              {"seconds", std::max(0.0, unix_seconds() - current_.start)},
              {"ranks", current_.ranks}};
  if (current_.price_per_hour) out["price_per_hour"] = *current_.price_per_hour;
  return out;
}

json CostLedger::to_json() const {
  json attempts = json::array();
  std::vector<Attempt> all = earlier_;
  Attempt now = current_;
  now.seconds = std::max(0.0, unix_seconds() - current_.start);
  all.push_back(now);
  for (const Attempt& a : all) {
    attempts.push_back({{"start", a.start},
                        {"seconds", a.seconds},
                        {"ranks", a.ranks},
                        {"price_per_hour", a.price_per_hour ? json(*a.price_per_hour) : json()}});
  }
  return {{"attempts", attempts}};
}

double CostLedger::seconds() const {
  double total = std::max(0.0, unix_seconds() - current_.start);
  for (const Attempt& a : earlier_) total += a.seconds;
  return total;
}

std::optional<double> CostLedger::spent() const {
  bool priced = current_.price_per_hour.has_value();
  Attempt now = current_;
  now.seconds = std::max(0.0, unix_seconds() - current_.start);
  double total = attempt_cost(now);
  for (const Attempt& a : earlier_) {
    priced = priced || a.price_per_hour.has_value();
    total += attempt_cost(a);
  }
  if (!priced) return std::nullopt;
  return total;
}

std::optional<double> CostLedger::rate_per_second() const {
  if (!current_.price_per_hour) return std::nullopt;
  return *current_.price_per_hour * static_cast<double>(current_.ranks) / 3600;
}

bool CostLedger::would_pass_budget(double seconds_ahead) const {
  const std::optional<double> now = spent();
  const std::optional<double> rate = rate_per_second();
  if (budget_ <= 0 || !now || !rate) return false;
  return *now + *rate * std::max(0.0, seconds_ahead) > budget_;
}

json CostLedger::summary() const {
  const std::optional<double> money = spent();
  const std::optional<double> rate = rate_per_second();
  return {{"seconds", seconds()},
          {"attempts", earlier_.size() + 1},
          {"spent", money ? json(*money) : json()},
          {"price_per_hour", rate ? json(*rate * 3600) : json()},
          {"price_source", price_source_.empty() ? json() : json(price_source_)},
          {"budget", budget_ > 0 ? json(budget_) : json()}};
}

std::optional<std::pair<double, std::string>> price_for(double configured,
                                                        const std::string& device_name,
                                                        const std::vector<Card>& cards) {
  if (configured > 0) return std::make_pair(configured, std::string("cost.price_per_hour"));
  const std::vector<std::string> device = words(device_name);
  const Card* best = nullptr;
  size_t best_words = 0;
  for (const Card& card : cards) {
    if (!card.price_per_hour) continue;
    const std::vector<std::string> name = words(card.name);
    // "NVIDIA" is in every NVIDIA device's name: it does not tell one card from another.
    size_t telling = 0;
    bool all = !name.empty();
    for (const std::string& w : name) {
      if (std::find(device.begin(), device.end(), w) == device.end()) all = false;
      if (w != "nvidia") ++telling;
    }
    if (all && telling > 0 && name.size() > best_words) best = &card, best_words = name.size();
  }
  if (!best) return std::nullopt;
  return std::make_pair(*best->price_per_hour, "card " + best->name);
}

}  // namespace gpurun

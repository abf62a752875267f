// The rental cards `gpurun plan` forecasts a run on: data, not code. The bundled table is
// examples/cards.yaml, compiled in; `--cards FILE` reads a user's file of the same form:
//
//   cards:
//     - {name: "RTX 4090", memory: 24GiB, bf16_tflops: 165, fp32_tflops: 83, price_per_hour: 3}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpurun {

struct Card {
  std::string name;
  int64_t memory_bytes = 0;              ///< `memory`, a SIZE
  double bf16_tflops = 0;                ///< dense bf16/fp16 throughput, 10^12 FLOP/s, > 0
  std::optional<double> fp32_tflops;     ///< dense fp32 throughput; none: not given
  std::optional<double> price_per_hour;  ///< in the user's currency; none: not given
};

/// Parses the YAML text of a cards file; `origin` names it in errors. Throws ConfigError (exit 2)
/// naming the card and the key: an unknown key (with the nearest known one), a missing name,
/// memory or bf16_tflops, a bad SIZE or one under 1 MiB (a forgotten unit), a throughput that
/// is not a finite number > 0, a price that is not a finite number >= 0, no card at all, or a
/// name given twice.
std::vector<Card> parse_cards(const std::string& yaml_text, const std::string& origin);

/// Reads and parses the file at `path`; throws ConfigError when it cannot be read.
std::vector<Card> load_cards(const std::string& path);

/// The bundled table (examples/cards.yaml).
const std::vector<Card>& bundled_cards();

/// The card of `cards` with the least memory whose memory less `headroom` (a fraction of it, as
/// memory.headroom) holds `need_bytes`, as its name and memory, e.g. "A100 40GB (37.25 GiB)";
/// the first of equal ones in the table; "" when none does.
std::string smallest_card_for(const std::vector<Card>& cards, int64_t need_bytes, double headroom);

}  // namespace gpurun

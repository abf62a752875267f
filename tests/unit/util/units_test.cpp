// Unit tests of SIZE parsing (--memory-limit, memory.capacity) and byte formatting.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gpurun/errors.h"
#include "util/units.h"

namespace gpurun {
namespace {

TEST(ParseSize, Table) {
  const std::vector<std::pair<std::string, int64_t>> cases = {
      {"0", 0},
      {"1000000", 1000000},
      {"512B", 512},
      {"512MiB", 512LL << 20},
      {"24GiB", 24LL << 30},
      {"1.5GiB", 3LL << 29},
      {"2 GB", 2000000000},
      {"3KB", 3000},
      {"1KiB", 1024},
      {"2TiB", 2LL << 40},
      {"1TB", 1000000000000},
      {"9223372036854775807", INT64_MAX},
      // Issue 31, item 8: lower-case units were refused; a size is never in bits here.
      {"8gib", 8LL << 30},
      {"8gb", 8000000000},
      {"512mib", 512LL << 20},
      {"1Gib", 1LL << 30},
      {"16 kb", 16000},
  };
  for (const auto& [text, bytes] : cases) EXPECT_EQ(parse_size(text), bytes) << text;
  for (const char* bad :
       {"", "12XB", "-5MiB", "1.5", "MiB", "1..5GiB", "1gibi", "1e9", "12 B x", "99999999999TB"}) {
    EXPECT_THROW(parse_size(bad), ConfigError) << bad;
  }
  try {
    parse_size("12XB");
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "invalid size \"12XB\"; use a byte count or a unit: B, KiB, MiB, GiB, TiB, KB, MB, "
              "GB, TB (in any case: 8gib is 8GiB, 8gb is 8GB)");
  }
}

TEST(FormatBytes, Units) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(3LL << 20), "3.00 MiB");
  EXPECT_EQ(format_bytes(3LL << 29), "1.50 GiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
}

}  // namespace
}  // namespace gpurun

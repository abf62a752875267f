// The TensorBoard files' framing and content (report/tensorboard_writer.h). That TensorBoard's
// own reader reads them is shown on real runs (tests/integration/see_the_run_test.cpp).
#include "report/tensorboard_writer.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "report/reporter.h"
#include "util/crc32c.h"

namespace {

using gpurun::crc32c;
using gpurun::masked_crc32c;

uint64_t u64_at(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

uint32_t u32_at(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

/// The payloads of a TFRecord file, every length and CRC checked; fails the test at the
/// first record that does not check out.
std::vector<std::string> records(const std::string& data) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < data.size()) {
    EXPECT_GE(data.size() - at, 16u) << "a cut record at byte " << at;
    if (data.size() - at < 16) break;
    const uint64_t n = u64_at(data, at);
    EXPECT_EQ(u32_at(data, at + 8), masked_crc32c(data.data() + at, 8)) << "at byte " << at;
    EXPECT_LE(at + 16 + n, data.size());
    const std::string payload = data.substr(at + 12, n);
    EXPECT_EQ(u32_at(data, at + 12 + n), masked_crc32c(payload.data(), payload.size()));
    out.push_back(payload);
    at += 16 + n;
  }
  return out;
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::filesystem::path> event_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  if (!std::filesystem::is_directory(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// RFC 3720, appendix B.4: the iSCSI check values of CRC-32C.
TEST(Crc32c, MatchesTheRfcCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  // TFRecord's mask of the empty payload's CRC (0): the constant alone.
  EXPECT_EQ(masked_crc32c("", 0), 0xa282ead8u);
}

TEST(TensorBoard, ATfRecordIsLengthCrcPayloadCrc) {
  const std::string r = gpurun::tfrecord("payload");
  ASSERT_EQ(r.size(), 7u + 16u);
  EXPECT_EQ(u64_at(r, 0), 7u);
  const auto payloads = records(r);
  ASSERT_EQ(payloads.size(), 1u);
  EXPECT_EQ(payloads[0], "payload");
}

TEST(TensorBoard, EachMetricsEventGivesItsScalarsAtItsStep) {
  const auto step = gpurun::scalars_of_event({{"event", "step"},
                                              {"time", 1.5e9},
                                              {"global_step", 40},
                                              {"loss", 0.5},
                                              {"lr", 0.01},
                                              {"samples_per_second", 900.0}},
                                             0);
  EXPECT_EQ(step.step, 40);
  EXPECT_DOUBLE_EQ(step.wall_time, 1.5e9);
  ASSERT_EQ(step.values.size(), 3u);
  EXPECT_EQ(step.values[0].first, "train/loss");
  EXPECT_EQ(step.values[1].first, "train/lr");
  EXPECT_EQ(step.values[2].first, "train/samples_per_second");
  // A plan applies from the step after the one it was made at; the epoch's peak is plotted
  // with the capacity of the last plan.
  const auto plan = gpurun::scalars_of_event({{"event", "plan"},
                                              {"time", 1.0},
                                              {"global_step", 300},
                                              {"measured_peak_bytes", 1000},
                                              {"capacity_bytes", 4000}},
                                             0);
  EXPECT_EQ(plan.step, 301);
  const auto epoch = gpurun::scalars_of_event({{"event", "epoch"},
                                               {"global_step", 64},
                                               {"eval_loss", 0.4},
                                               {"eval_accuracy", nullptr},
                                               {"peak_bytes", 1200}},
                                              4000);
  ASSERT_EQ(epoch.values.size(), 3u);  // a null accuracy is left out
  EXPECT_EQ(epoch.values[2].first, "memory/capacity_bytes");
  EXPECT_TRUE(
      gpurun::scalars_of_event({{"event", "resume"}, {"global_step", 3}}, 0).values.empty());
}

// The Reporter of rank 0 writes one file per process: the version, the START at the first
// step it trains, then one record per event with scalars, each flushed as it happens.
TEST(TensorBoard, TheReporterWritesOneCheckedFilePerProcessOnRankZeroOnly) {
  gpurun::test::TempDir dir("tensorboard");
  for (int process = 0; process < 2; ++process) {
    gpurun::Reporter reporter(dir.path(), true, 0);
    reporter.event(
        "plan",
        {{"global_step", process * 10}, {"measured_peak_bytes", 100}, {"capacity_bytes", 1000}});
    reporter.event("step", {{"global_step", process * 10 + 5}, {"loss", 1.0}});
    reporter.event(
        "checkpoint",
        {{"global_step", process * 10 + 10}, {"stall_seconds", 0.01}, {"write_seconds", 0.2}});
  }
  {
    gpurun::Reporter rank1(dir.path(), false, 1);
    rank1.event("plan", {{"global_step", 0}});
  }
  const auto files = event_files(std::filesystem::path(dir.path()) / "tensorboard");
  ASSERT_EQ(files.size(), 2u);
  for (const auto& f : files) {
    EXPECT_EQ(f.filename().string().rfind("events.out.tfevents.", 0), 0u) << f;
    const auto payloads = records(slurp(f));
    EXPECT_EQ(payloads.size(), 5u) << f;  // version, START, plan, step, checkpoint
    ASSERT_FALSE(payloads.empty());
    EXPECT_NE(payloads[0].find("brain.Event:2"), std::string::npos);
  }
  EXPECT_LT(files[0].filename().string(), files[1].filename().string());
}

// A run directory whose tensorboard/ cannot be made: the metrics go on, the writer stops.
TEST(TensorBoard, AnUnusableDirectoryLeavesTheMetricsAlone) {
  gpurun::test::TempDir dir("tensorboard");
  std::ofstream(std::filesystem::path(dir.path()) / "tensorboard") << "a file, not a directory";
  {
    gpurun::Reporter reporter(dir.path(), true, 0);
    reporter.event("plan", {{"global_step", 0}});
    reporter.event("step", {{"global_step", 1}, {"loss", 1.0}});
  }
  const std::string metrics = slurp(std::filesystem::path(dir.path()) / "metrics.jsonl");
  EXPECT_NE(metrics.find("\"step\""), std::string::npos) << metrics;
}

}  // namespace

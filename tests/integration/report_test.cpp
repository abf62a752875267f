// What a run reports while it trains: samples/s and ETA measured over the real wall time
// (issue 16, defect 3).
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

/// Every event of RUN_DIR/metrics.jsonl, in order.
std::vector<nlohmann::json> all_events(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  const std::string text = slurp(run_dir + "/metrics.jsonl");
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    auto j = nlohmann::json::parse(text.substr(start, end - start), nullptr, false);
    if (!j.is_discarded()) out.push_back(j);
    start = end + 1;
  }
  return out;
}

nlohmann::json status_json(const std::string& run_dir) {
  auto j = nlohmann::json::parse(slurp(run_dir + "/status.json"), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << slurp(run_dir + "/status.json");
  return j;
}

// 2048 samples of batch 64 are 32 steps an epoch; a full evaluation set makes every epoch end
// take a good part of the epoch's time, which the rate must include.
std::vector<std::string> timed_run(const TempDir& dir, const std::string& name, int every_steps) {
  const std::string config = write_config(dir, small_config(2048, 64, 3));
  return with_sets({config, "--ckpt", dir / name},
                   {"model.hidden=[256,256]", "data.eval_samples=2000",
                    "log.every_steps=" + std::to_string(every_steps)});
}

// Defect 3: with log.every_steps smaller than, equal to, larger than and not a divisor of the
// epoch's 32 steps, every step event's samples/s is the samples since the previous event over
// the time between the two events (the first one: since the plan event, where training
// starts), evaluation and saves included; its ETA is the remaining steps at the run's mean
// time per step so far.
TEST(Rate, SamplesPerSecondAndEtaAreMeasuredOverTheRealTimeAcrossEpochBoundaries) {
  TempDir dir;
  for (int every : {10, 32, 50, 45}) {
    SCOPED_TRACE("log.every_steps=" + std::to_string(every));
    const std::string name = "ckpt" + std::to_string(every);
    Result r = run_gpurun(timed_run(dir, name, every));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const int64_t batch = 64, total = 96;
    double previous_time = -1, start_time = -1;
    int64_t previous_step = 0;
    int steps_seen = 0;
    nlohmann::json last_step;
    for (const auto& e : all_events(dir / name)) {
      const std::string kind = e.value("event", "");
      if (kind == "plan" && start_time < 0) previous_time = start_time = e["time"].get<double>();
      if (kind != "step") continue;
      ASSERT_GE(previous_time, 0) << "a step event before the plan event";
      ++steps_seen;
      last_step = e;
      const int64_t step = e["global_step"].get<int64_t>();
      const double time = e["time"].get<double>();
      const double expected = (step - previous_step) * batch / (time - previous_time);
      const double reported = e["samples_per_second"].get<double>();
      EXPECT_NEAR(reported, expected, 0.1 * expected)
          << "global step " << step << ": " << (step - previous_step) << " steps in "
          << (time - previous_time) << " s";
      ASSERT_TRUE(e.contains("eta_seconds")) << e.dump();
      const double eta = (total - step) * (time - start_time) / step;
      EXPECT_NEAR(e["eta_seconds"].get<double>(), eta, 0.1 * eta + 0.05)
          << "global step " << step << " of " << total;
      previous_step = step;
      previous_time = time;
    }
    EXPECT_EQ(steps_seen, total / every);
    const nlohmann::json status = status_json(dir / name);
    EXPECT_EQ(status.value("state", ""), "finished");
    EXPECT_DOUBLE_EQ(status.value("samples_per_second", -1.0),
                     last_step.value("samples_per_second", -2.0));
    EXPECT_EQ(status.value("eta_seconds", -1.0), 0.0);
  }
}

}  // namespace
}  // namespace gpurun::test

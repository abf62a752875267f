// What a planner that exists to prevent out-of-memory crashes must never do (issue 31, item 1):
// be killed by the kernel, go past its limit, ignore Ctrl-C, or take minutes. Each test drives
// the real binary and measures its wall time and resident memory (wait4's ru_maxrss).
#include <unistd.h>

#include <csignal>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

int64_t host_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}

/// A gpt of 24 blocks of width 2048, context 2048, bf16, AdamW: 1.3 B parameters, 5 GB of
/// fp32 weights (a quarter of this machine's memory), 21 GB with gradients and Adam's moments.
const char* kGpt1B =
    "model: {name: gpt, layers: 24, heads: 16, width: 2048, dropout: 0}\n"
    "data: {name: text, path: /usr/local/share/gpurun/kjv.txt, context: 2048, "
    "train_samples: 64, eval_samples: 8}\n"
    "optim: {name: adamw, lr: 0.0003}\n"
    "train: {epochs: 1, batch_size: 1, precision: bf16}\n";

TEST(PlanSafety, A1BGptThatCannotFitIsPlannedFromTheEstimateInSecondsAndLittleMemory) {
  TempDir dir;
  const std::string config = write_config(dir, kGpt1B);
  // Its state alone (parameters, gradients, Adam) exceeds a 24 GB machine; on a larger one a
  // limit makes the same case.
  std::vector<std::string> args{"plan", config, "--json"};
  if (host_bytes() > 40 * kGiB) args.insert(args.end(), {"--memory-limit", "20GiB"});
  const Result plan = run_gpurun(args, {}, 180);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_LT(plan.seconds, 60) << plan.err;
  EXPECT_LT(plan.max_rss_bytes, 4 * kGiB) << plan.err;
  const nlohmann::json j = nlohmann::json::parse(plan.out);
  EXPECT_EQ(j["estimate_only"], true) << plan.out;
  const std::string why = j["why"];
  EXPECT_TRUE(contains(why, "the run does not fit this device by the estimate")) << why;
  EXPECT_GT(j["parameters"]["total"].get<int64_t>(), 1'100'000'000);
  EXPECT_FALSE(j["cards"].empty());
}

TEST(PlanSafety, A1BGptRunUnderALimitIsRefusedWithTheNumbersNeverKilled) {
  TempDir dir;
  const std::string config = write_config(dir, kGpt1B);
  const Result run =
      run_gpurun({config, "--ckpt", dir / "ckpt", "--memory-limit", "16GiB"}, {}, 180);
  EXPECT_EQ(run.signal, 0) << run.err;
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_LT(run.seconds, 60) << run.err;
  EXPECT_LT(run.max_rss_bytes, 4 * kGiB) << run.err;
  EXPECT_TRUE(contains(run.err, "the run does not fit this device by the estimate")) << run.err;
  EXPECT_TRUE(contains(run.err, std::to_string(16 * kGiB) + " bytes")) << run.err;
  EXPECT_TRUE(contains(run.err, "optimizer state")) << run.err;
  // 21.2 GiB: not a 24 GB card less its headroom, the 40 GB one of the bundled table.
  EXPECT_TRUE(contains(run.err, "the smallest card that fits: A100 40GB")) << run.err;
}

/// A plan that probes long enough to be stopped: many probe steps of a small model.
std::string slow_plan_config(const TempDir& dir) {
  return write_config(dir,
                      "model: {name: mlp, hidden: [256]}\n"
                      "data: {name: idx, train_samples: 512, eval_samples: 100}\n"
                      "optim: {name: sgd, lr: 0.05}\n"
                      "train: {epochs: 1, batch_size: 64, threads: 1}\n"
                      "memory: {probe_steps: 1000000}\n");
}

/// Starts `gpurun plan` and sends `sig` once the first probe has started (its log line).
Result stop_plan_while_probing(int sig) {
  TempDir dir;
  const std::string config = slow_plan_config(dir);
  const std::string log = dir / "plan";
  const pid_t pid = start_gpurun({"plan", config}, log);
  bool probing = false;
  for (int i = 0; i < 6000 && !probing; ++i) {  // up to 60 s: the log line, not a fixed wait
    probing = contains(slurp(log + ".err"), "probing micro-batch");
    if (!probing) sleep_for(0.01);
  }
  EXPECT_TRUE(probing) << slurp(log + ".err");
  kill(pid, sig);
  return wait_gpurun(pid, log, 30);
}

TEST(PlanSafety, PlanStopsAtTheFirstSigtermOrSigintAndNeverTalksOfResume) {
  const Result term = stop_plan_while_probing(SIGTERM);
  EXPECT_EQ(term.signal, 0);
  EXPECT_EQ(term.exit_code, 75) << term.err;
  EXPECT_LT(term.seconds, 10) << term.err;
  EXPECT_TRUE(contains(term.err, "gpurun plan: stopped by a signal; nothing was written"))
      << term.err;
  EXPECT_FALSE(contains(term.err, "--resume")) << term.err;

  const Result interrupt = stop_plan_while_probing(SIGINT);
  EXPECT_EQ(interrupt.exit_code, 130) << interrupt.err;
  EXPECT_LT(interrupt.seconds, 10) << interrupt.err;
  EXPECT_TRUE(contains(interrupt.err, "gpurun plan: stopped by SIGINT")) << interrupt.err;
  EXPECT_FALSE(contains(interrupt.err, "--resume")) << interrupt.err;
}

// A plan of a 25.6 M-parameter gpt took 7 minutes: it probed fp32, bf16 and fp16 with real
// steps, and the card table's lines with three more. Now it runs the plan's own probes (one
// training probe that fits as configured, evaluation, checkpoint capture and loading), measures
// the run's precision only, and reports one step time. Counted here in probes, not seconds,
// since the time depends on the machine.
TEST(PlanSafety, PlanProbesOnlyWhatTheDecisionNeedsAndReportsOneStepTime) {
  TempDir dir;
  const std::string config = write_config(
      dir,
      "model: {name: gpt, layers: 2, heads: 2, width: 32, dropout: 0}\n"
      "data: {name: text, path: /usr/local/share/gpurun/kjv.txt, context: 32, "
      "train_samples: 256, eval_samples: 64}\n"
      "optim: {name: adamw, lr: 0.001}\n"
      "train: {epochs: 1, batch_size: 16, eval_batch_size: 32, precision: bf16, threads: 1}\n");
  const Result plan = run_gpurun({"plan", config, "--json"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_EQ(count_of(plan.err, "probing micro-batch"), 1u) << plan.err;
  EXPECT_EQ(count_of(plan.err, "probing the plan's step under"), 0u) << plan.err;
  const nlohmann::json j = nlohmann::json::parse(plan.out);
  EXPECT_EQ(j["reason"], "fits as configured");
  const double step = j["optimizer_step_seconds"];
  EXPECT_DOUBLE_EQ(step, j["step_seconds"].get<double>() * j["accumulation_steps"].get<double>());
  ASSERT_EQ(j["precisions"].size(), 3u);
  for (const auto& row : j["precisions"]) {
    EXPECT_GT(row["estimated_peak_bytes"].get<int64_t>(), 0) << row;
    if (row["this_run"].get<bool>()) {
      EXPECT_EQ(row["precision"], "bf16");
      EXPECT_EQ(row["measured_peak_bytes"], j["measured_peaks"]["training"]) << row;
      EXPECT_DOUBLE_EQ(row["step_seconds"].get<double>(), step) << row;
    } else {
      EXPECT_TRUE(row["measured_peak_bytes"].is_null()) << row;
      EXPECT_TRUE(row["step_seconds"].is_null()) << row;
    }
  }
  EXPECT_GT(j["seconds"].get<double>(), 0);
  EXPECT_GT(j["host_peak_rss_bytes"].get<int64_t>(), 0);

  const Result all = run_gpurun({"plan", config, "--json", "--probe-precisions"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_TRUE(contains(all.err, "probing the plan's step under fp32")) << all.err;
  EXPECT_TRUE(contains(all.err, "probing the plan's step under fp16")) << all.err;
  for (const auto& row : nlohmann::json::parse(all.out)["precisions"])
    EXPECT_TRUE(row["step_seconds"].is_number()) << row;

  const Result text = run_gpurun({"plan", config});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(count_of(text.out, "s per optimizer step (1 micro-batch of 16, measured)"), 1u)
      << text.out;
  EXPECT_TRUE(contains(text.out, "not probed (--probe-precisions)")) << text.out;
}

}  // namespace
}  // namespace gpurun::test

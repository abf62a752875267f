// The loader (data/loader.h) with the real binary: the worker count never changes what is
// learned (also across a SIGKILL or a SIGTERM and a resume), the data wait of every step event
// is what the training thread really waited, a data set that throws ends the run with exit 1
// naming the sample, and the report draws the wait.
#include <signal.h>

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

/// The data wait of each step event after the first `skip` steps, in step order.
std::vector<double> waits(const std::string& run_dir, int64_t skip) {
  std::vector<double> out;
  for (const auto& e : events(run_dir, "step"))
    if (e["global_step"].get<int64_t>() > skip && e.contains("data_wait_seconds"))
      out.push_back(e["data_wait_seconds"].get<double>());
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// test_mlp on test_slow_blobs (tests/plugin): 512 samples in batches of 32, 16 steps an epoch.
std::string slow_config(int epochs) {
  return "model: {plugin: " + std::string(GPURUN_TEST_PLUGIN) +
         ", name: test_mlp, hidden: [32]}\n"
         "data: {name: test_slow_blobs, train_samples: 512, eval_samples: 128}\n"
         "optim: {name: sgd, lr: 0.05, momentum: 0.9}\n"
         "train: {epochs: " +
         std::to_string(epochs) +
         ", batch_size: 32, seed: 3, threads: 1}\n"
         "checkpoint: {every_steps: 4}\n"
         "log: {every_steps: 1}\n";
}

std::string digest_of(const std::string& ckpt) { return inspect(ckpt).value("model_digest", ""); }

TEST(Loader, WorkerCountsGiveTheSameDigestAndTheReportDrawsTheWait) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(640, 32, 2));
  std::string expected;
  for (const char* workers : {"0", "1", "4"}) {
    const std::string ckpt = dir / (std::string("w") + workers);
    const Result r =
        run_gpurun(with_sets({config, "--ckpt", ckpt}, {std::string("data.workers=") + workers}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto plan = events(ckpt, "plan");
    ASSERT_FALSE(plan.empty());
    EXPECT_EQ(plan[0]["data_workers"], std::stoi(workers));
    const std::string digest = digest_of(ckpt);
    ASSERT_EQ(digest.size(), 16u);
    if (expected.empty()) expected = digest;
    EXPECT_EQ(digest, expected) << "data.workers " << workers;
    // Every step event carries the wait; the epoch events the evaluation's.
    for (const auto& e : events(ckpt, "step"))
      EXPECT_TRUE(e.contains("data_wait_seconds") && e["data_wait_seconds"].get<double>() >= 0)
          << e.dump();
    for (const auto& e : events(ckpt, "epoch"))
      EXPECT_TRUE(e.contains("eval_data_wait_seconds")) << e.dump();
  }
  // gpurun report: the data wait beside the throughput, one point per step event.
  const Result report = run_gpurun({"report", dir / "w4"});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  const std::string html = slurp(dir / "w4/report.html");
  const std::string open = "id=\"gpurun-data\">";
  const size_t begin = html.find(open);
  ASSERT_NE(begin, std::string::npos);
  const size_t end = html.find("</script>", begin);
  const auto data = nlohmann::json::parse(
      html.substr(begin + open.size(), end - begin - open.size()), nullptr, false);
  ASSERT_FALSE(data.is_discarded());
  bool drawn = false;
  for (const auto& c : data["charts"]) {
    if (c["id"] != "data_wait") continue;
    ASSERT_EQ(c["datasets"].size(), 1u);
    EXPECT_EQ(c["datasets"][0]["label"], "data wait per optimizer step");
    EXPECT_EQ(c["datasets"][0]["points"].size(), events(dir / "w4", "step").size());
    drawn = true;
  }
  EXPECT_TRUE(drawn) << "no data_wait chart in the page's data";
}

// Each fetch sleeps 50 ms. With 2 workers and a step that takes 150 ms on the training thread
// (a sleep after each step), the batches are ready before they are asked for: the wait is about
// 0 after the epoch's first step. Fetched on the training thread (workers 0), every step waits
// the whole fetch. Bounds are generous: the machine is shared and its speed unknown.
TEST(Loader, TheDataWaitIsAbout0WithWorkersAheadAndTheFetchTimeWithout) {
  TempDir dir;
  const std::string config = write_config(dir, slow_config(1));
  const Env env{{"GPURUN_TEST_DATA_SLEEP_MS", "50"}, {"GPURUN_FAULT", "sleep150:after_step:*"}};
  const Result ahead =
      run_gpurun(with_sets({config, "--ckpt", dir / "ahead"}, {"data.workers=2"}), env);
  ASSERT_EQ(ahead.exit_code, 0) << ahead.err;
  const Result inline_fetch =
      run_gpurun(with_sets({config, "--ckpt", dir / "inline"}, {"data.workers=0"}), env);
  ASSERT_EQ(inline_fetch.exit_code, 0) << inline_fetch.err;

  const std::vector<double> with_workers = waits(dir / "ahead", 1);
  ASSERT_EQ(with_workers.size(), 15u);
  EXPECT_LT(median(with_workers), 0.010) << "median wait with 2 workers";
  const std::vector<double> without = waits(dir / "inline", 0);
  ASSERT_EQ(without.size(), 16u);
  EXPECT_GE(*std::min_element(without.begin(), without.end()), 0.045);  // the sleep, at least
  EXPECT_LT(median(without), 0.5);
  EXPECT_EQ(digest_of(dir / "ahead"), digest_of(dir / "inline"));
}

// A data set that throws on sample 100 (its message names a file): exit 1, the message names the
// sample and the file; --max-restarts retries it as any exit 1.
TEST(Loader, AWorkersExceptionExits1NamingTheSampleAndIsRetried) {
  TempDir dir;
  const std::string config = write_config(dir, slow_config(1));
  const Env env{{"GPURUN_TEST_DATA_THROW_AT", "100"}};
  const Result r =
      run_gpurun(with_sets({config, "--ckpt", dir / "ckpt", "--resume", "--max-restarts", "1"},
                           {"data.workers=2"}),
                 env, 120);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "the data set failed on sample 100")) << r.err;
  EXPECT_TRUE(contains(r.err, "/data/blobs/sample-100.bin: truncated")) << r.err;
  EXPECT_GE(count_of(r.err, "failed on sample 100"), 2u) << "not retried:\n" << r.err;
}

// SIGTERM while 4 workers keep 8 slow batches (200 ms each) in flight and the training thread
// waits for them: exit 75 well within the grace, a checkpoint that verifies, and a resume that ends
// at the digest of an uninterrupted run.
TEST(Loader, SigtermDuringHeavyPrefetchExits75WithItsCheckpointAndResumesExactly) {
  TempDir dir;
  const std::string config = write_config(dir, slow_config(2));
  const Env slow{{"GPURUN_TEST_DATA_SLEEP_MS", "200"}};
  const std::vector<std::string> sets{"data.workers=4", "data.prefetch=8"};
  const Result full = run_gpurun(with_sets({config, "--ckpt", dir / "full"}, sets), slow);
  ASSERT_EQ(full.exit_code, 0) << full.err;

  const std::vector<std::string> args =
      with_sets({config, "--ckpt", dir / "ckpt", "--resume"}, sets);
  const pid_t pid = start_gpurun(args, dir / "stopped", slow);
  ASSERT_TRUE(wait_for_step(dir / "ckpt", 6, pid).has_value());
  kill(pid, SIGTERM);
  const Result stopped = wait_gpurun(pid, dir / "stopped", 60);
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  EXPECT_LT(stopped.seconds, 20.0);
  const Result verify = run_gpurun({"ckpt", "verify", dir / "ckpt"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  const Result resumed = run_gpurun(args, slow);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(digest_of(dir / "ckpt"), digest_of(dir / "full"));
}

// SIGKILL with 2 workers fetching, then --resume: the digest of the uninterrupted run, which
// fetched on the training thread.
TEST(Loader, SigkillAndResumeWithTwoWorkersGiveTheUninterruptedDigest) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(640, 32, 2));
  const Result full = run_gpurun(with_sets({config, "--ckpt", dir / "full"}, {"data.workers=0"}));
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const std::vector<std::string> args =
      with_sets({config, "--ckpt", dir / "ckpt", "--resume"},
                {"data.workers=2", "checkpoint.every_steps=4", "checkpoint.async=false"});
  const Result killed = run_gpurun(args, {{"GPURUN_FAULT", "sigkill:after_step:27"}});
  ASSERT_EQ(killed.signal, SIGKILL) << "exit " << killed.exit_code << "\n" << killed.err;
  const Result resumed = run_gpurun(args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto resumes = events(dir / "ckpt", "resume");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_EQ(resumes[0]["position_in_epoch"], 128);  // step 24, 20 steps an epoch: mid-epoch
  EXPECT_EQ(digest_of(dir / "ckpt"), digest_of(dir / "full"));
}

}  // namespace
}  // namespace gpurun::test

// Unattended overnight (issue 44): the run's messages to a webhook of the test's own
// (tests/tools/notify/webhook_sink.py, which answers 500 to the first POST and 200 after), the
// cost ledger over attempts, and the budget's stop.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kSecret = "T0SECRET/B0SECRET/xoxb-notify-secret";

/// webhook_sink.py on a free port, stopped by the destructor.
class WebhookSink {
 public:
  WebhookSink(const TempDir& dir, const std::vector<std::string>& flags = {"--fail-first", "1"})
      : log_(dir / "webhook.jsonl"), prefix_(dir / "webhook") {
    std::vector<std::string> argv{
        "/usr/bin/python3",
        std::string(GPURUN_SOURCE_DIR) + "/tests/tools/notify/webhook_sink.py",
        "--port-file",
        dir / "webhook.port",
        "--log",
        log_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    pid_ = start_program(argv, prefix_);
    for (int i = 0; i < 200 && trimmed(slurp(dir / "webhook.port")).empty(); ++i) sleep_for(0.05);
    port_ = trimmed(slurp(dir / "webhook.port"));
  }
  ~WebhookSink() {
    kill(pid_, SIGTERM);
    wait_gpurun(pid_, prefix_, 30);
  }
  bool ok() const { return !port_.empty(); }
  std::string url() const { return "http://127.0.0.1:" + port_ + "/services/" + kSecret; }

  /// Every POST it answered, in order.
  std::vector<json> posts() const {
    std::vector<json> out;
    std::istringstream lines(slurp(log_));
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (!j.is_discarded()) out.push_back(j);
    }
    return out;
  }
  /// The events of the messages it took (answered 200), in order.
  std::vector<std::string> delivered() const {
    std::vector<std::string> out;
    for (const json& p : posts())
      if (p["status"] == 200) out.push_back(p["body"].value("event", "?"));
    return out;
  }
  /// The body of the delivered message of `event`; null when none.
  json message(const std::string& event) const {
    for (const json& p : posts())
      if (p["status"] == 200 && p["body"].value("event", "") == event) return p["body"];
    return json();
  }
  /// Waits until `n` messages were delivered, at most `seconds`.
  bool wait_for(size_t n, double seconds) const {
    for (double waited = 0; waited < seconds; waited += 0.1) {
      if (delivered().size() >= n) return true;
      sleep_for(0.1);
    }
    return delivered().size() >= n;
  }

 private:
  std::string log_, prefix_, port_;
  pid_t pid_ = -1;
};

/// The step of a run's stop at its budget: exit 4 naming `budget`, one `done` event with reason
/// budget, at a step in (0, `steps`), and the newest checkpoint of `run_dir` saved there for
/// that reason; 0 after a failed expectation.
int64_t budget_stop_step(const Result& r, const std::string& run_dir, const std::string& budget,
                         int64_t steps) {
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_TRUE(contains(r.err, "stopped at cost.budget " + budget)) << r.err;
  const std::vector<json> done = events(run_dir, "done");
  EXPECT_EQ(done.size(), 1u);
  if (done.size() != 1 || done[0].value("reason", "") != "budget") return 0;
  const int64_t stop = done[0].value("global_step", int64_t{0});
  EXPECT_LT(stop, steps);
  const json manifest = inspect(run_dir);
  EXPECT_EQ(manifest["global_step"], stop);
  EXPECT_EQ(manifest["extra"]["reason"], "budget");
  return stop < steps ? stop : 0;
}

using Events = std::vector<std::string>;

/// The secret part of the webhook's URL appears in no log, event, status or manifest.
void expect_secret_kept(const TempDir& dir, const std::string& run_dir, const Result& r) {
  EXPECT_EQ(r.err.find("SECRET"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("SECRET"), std::string::npos) << r.out;
  for (const auto& entry : fs::recursive_directory_iterator(run_dir)) {
    if (!entry.is_regular_file() || entry.path().extension() == ".pt") continue;
    EXPECT_EQ(slurp(entry.path()).find("SECRET"), std::string::npos) << entry.path();
  }
  (void)dir;
}

TEST(Notify, AFinishedRunSendsStartedThenFinishedOnceThroughAFirst500) {
  TempDir dir;
  WebhookSink sink(dir);
  ASSERT_TRUE(sink.ok());
  const std::string config = write_config(dir, small_config(300, 30, 2));
  const std::vector<std::string> sets{"notify.url=" + sink.url()};
  Result r = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt"}, sets));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(sink.delivered(), (Events{"started", "finished"})) << slurp(dir / "webhook.jsonl");
  // The first POST met the 500 and was sent again.
  const std::vector<json> posts = sink.posts();
  ASSERT_GE(posts.size(), 3u);
  EXPECT_EQ(posts[0]["status"], 500);
  EXPECT_EQ(posts[0]["content_type"], "application/json");
  EXPECT_EQ(posts[0]["body"], posts[1]["body"]);
  const json finished = sink.message("finished");
  EXPECT_EQ(finished["run"], "ckpt");
  EXPECT_EQ(finished["step"], 20);
  EXPECT_EQ(finished["epoch"], 2);
  EXPECT_TRUE(finished["eval_loss"].is_number());
  EXPECT_TRUE(finished["elapsed_seconds"].is_number());
  EXPECT_TRUE(contains(finished.value("text", ""), "finished at step 20 of 20 (epoch 2/2)"))
      << finished.dump();
  expect_secret_kept(dir, dir / "ckpt", r);
  // A process that resumes the finished run (a restart loop after a kill at the very end)
  // sends neither again.
  Result again = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt", "--resume"}, sets));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(sink.delivered(), (Events{"started", "finished"}));
  EXPECT_TRUE(contains(again.err, "`finished` was sent before")) << again.err;
}

// A second launch on a directory that a live run holds exits 2 and sends no `failed`: it never
// was the run, which goes on and finishes. Its supervisor names no step (the heartbeat beside
// it is the live run's).
TEST(Notify, ASecondLaunchOnAHeldDirectorySendsNoFailedForTheRunThatHoldsIt) {
  TempDir dir;
  WebhookSink sink(dir, {});
  ASSERT_TRUE(sink.ok());
  const std::string config = write_config(dir, small_config(1000, 10, 1));  // 100 steps
  const std::vector<std::string> sets{"notify.url=" + sink.url()};
  const std::string ckpt = dir / "ckpt";
  // 150 ms a step: the holder lasts >= 15 s, past the second run's start-up and lease wait.
  const pid_t holder = start_gpurun(with_sets({config, "--ckpt", ckpt}, sets), dir / "holder",
                                    {{"GPURUN_FAULT", "sleep150:after_step:*"}});
  ASSERT_TRUE(wait_for_step(ckpt, 5, holder));
  std::vector<std::string> second_sets = sets;
  second_sets.push_back("checkpoint.lease_timeout=2");
  Result second = run_gpurun(with_sets({config, "--ckpt", ckpt, "--resume"}, second_sets));
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_TRUE(contains(second.err, "is in use by another run")) << second.err;
  EXPECT_TRUE(contains(second.err, "no `failed` message")) << second.err;
  EXPECT_FALSE(contains(second.err, "with code 2 at step")) << second.err;
  const Result first = wait_gpurun(holder, dir / "holder");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(sink.delivered(), (Events{"started", "finished"})) << slurp(dir / "webhook.jsonl");
}

TEST(Notify, AWorkerKilledAndRestartedSendsNoFailed) {
  TempDir dir;
  WebhookSink sink(dir);
  ASSERT_TRUE(sink.ok());
  const std::string config = write_config(dir, small_config(600, 30, 2));
  Result r = run_gpurun(
      with_sets({config, "--ckpt", dir / "ckpt", "--max-restarts", "1"},
                {"notify.url=" + sink.url(), "checkpoint.every_steps=4", "checkpoint.async=false"}),
      {{"GPURUN_FAULT", "sigkill:after_step:10"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGKILL")) << r.err;
  EXPECT_EQ(sink.delivered(), (Events{"started", "finished"})) << slurp(dir / "webhook.jsonl");
}

TEST(Notify, ARunThatFailsForGoodSendsFailedWithin10SecondsOfTheDeath) {
  TempDir dir;
  WebhookSink sink(dir);
  ASSERT_TRUE(sink.ok());
  const std::string config = write_config(dir, small_config(600, 30, 2));
  Result r = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt", "--max-restarts", "1"},
                                  {"notify.url=" + sink.url()}),
                        {{"GPURUN_FAULT", "exit1:after_step:5"}, {"GPURUN_FAULT_RESTART", "0,1"}});
  ASSERT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(sink.delivered(), (Events{"started", "failed"})) << slurp(dir / "webhook.jsonl");
  const json failed = sink.message("failed");
  EXPECT_EQ(failed["restarts"], 1);
  EXPECT_TRUE(contains(failed.value("text", ""), "failed")) << failed.dump();
  EXPECT_TRUE(contains(failed.value("error", ""), "exited with code 1")) << failed.dump();
  // The last worker's last event (its step 5) came less than 10 s before the message.
  const std::vector<json> steps = events(dir / "ckpt", "step");
  ASSERT_FALSE(steps.empty());
  EXPECT_LT(failed["time"].get<double>() - steps.back()["time"].get<double>(), 10.0);
}

TEST(Notify, ASigtermSendsPreempted) {
  TempDir dir;
  WebhookSink sink(dir);
  ASSERT_TRUE(sink.ok());
  const std::string config = write_config(dir, small_config(600, 30, 3));
  Result r = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt"}, {"notify.url=" + sink.url()}),
                        {{"GPURUN_FAULT", "sigterm:after_step:7"}});
  ASSERT_EQ(r.exit_code, 75) << r.err;
  EXPECT_EQ(sink.delivered(), (Events{"started", "preempted"})) << slurp(dir / "webhook.jsonl");
  const json preempted = sink.message("preempted");
  EXPECT_EQ(preempted["cause"], "SIGTERM");
  EXPECT_EQ(preempted["step"], 7);
}

TEST(Notify, AHangSendsStalledThenFailed) {
  TempDir dir;
  WebhookSink sink(dir);
  ASSERT_TRUE(sink.ok());
  const std::string config = write_config(dir, small_config(600, 30, 2));
  // 10 s: the start-up before the first heartbeat counts, and a loaded machine may take 3 s.
  Result r = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt", "--hang-timeout", "10"},
                                  {"notify.url=" + sink.url()}),
                        {{"GPURUN_FAULT", "sleep120000:after_step:4"}});
  ASSERT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(sink.delivered(), (Events{"started", "stalled", "failed"}))
      << slurp(dir / "webhook.jsonl");
  const json stalled = sink.message("stalled");
  EXPECT_GE(stalled["stalled_seconds"].get<double>(), 10.0);
  // The heartbeat's step: the hang comes after step 4, before its heartbeat.
  EXPECT_GE(stalled.value("step", -1), 3) << stalled.dump();
  EXPECT_LE(stalled.value("step", -1), 4) << stalled.dump();
  EXPECT_TRUE(contains(sink.message("failed").value("error", ""), "hung")) << r.err;
}

TEST(Notify, TheCommandGetsTheSameJsonOnStdin) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(300, 30, 1));
  const std::string got = dir / "got.jsonl";
  Result r = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt"},
                                  {"notify.command=cat >> " + got, "notify.on=[finished]"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json m = json::parse(trimmed(slurp(got)), nullptr, false);
  ASSERT_FALSE(m.is_discarded()) << slurp(got);
  EXPECT_EQ(m["event"], "finished");
  EXPECT_TRUE(contains(m.value("text", ""), "gpurun ckpt on ")) << m.dump();
}

TEST(Notify, AnEarlyStopIsAFinishedMessageWithItsReason) {
  TempDir dir;
  WebhookSink sink(dir);
  ASSERT_TRUE(sink.ok());
  const std::string config = write_config(dir, small_config(300, 30, 10));
  Result r = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt"},
                                  {"notify.url=" + sink.url(), "train.early_stop.metric=eval_loss",
                                   "train.early_stop.patience=2"}),
                        {{"GPURUN_TEST_EVAL_LOSS", "5,3,4,6,1,1,1,1,1,1"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(sink.delivered(), (Events{"started", "finished"})) << slurp(dir / "webhook.jsonl");
  const json finished = sink.message("finished");
  EXPECT_EQ(finished["reason"], "early_stop");
  EXPECT_EQ(finished["epoch"], 4);  // 3 at epoch 2, then 4 and 6: two epochs without a gain
  EXPECT_TRUE(
      contains(finished.value("text", ""), "finished early: eval_loss did not improve for 2"))
      << finished.dump();
}

// Three attempts (a SIGTERM, a second Ctrl-C that saves nothing, the end), each timed here from
// its start to its `done` event; the final status's ledger is their sum at the price, within 2%.
TEST(Cost, TheLedgerOverThreeAttemptsIsTheirWallTimeTimesThePrice) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(4000, 10, 1));
  const std::vector<std::string> sets{"cost.price_per_hour=36", "log.every_steps=1"};
  const Env slow{{"GPURUN_FAULT", "sleep40:after_step:*"}};
  // Each attempt's wall time, from just before the test starts it to its `done` event's clock
  // time: the process's last word, which the test's own wait may see late on a busy machine.
  double wall = 0;
  const auto attempt_seconds = [&](double started) {
    const std::vector<json> done = events(dir / "ckpt", "done");
    return done.empty() ? 0.0 : done.back().value("time", 0.0) - started;
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::vector<std::string> args{config, "--ckpt", dir / "ckpt"};
    if (attempt > 0) args.push_back("--resume");
    const std::string log = dir / ("attempt" + std::to_string(attempt));
    const double started = unix_now();
    // The second attempt is stopped by a second Ctrl-C while its stop's save waits before its
    // rename: it exits at once, leaving no checkpoint, and only its `done` event says how long
    // it ran.
    Env env = slow;
    if (attempt == 1) env["GPURUN_FAULT"] += ",sleep60000:before_rename:*";
    const pid_t pid = start_gpurun(with_sets(args, sets), log, env);
    // A step of this process's own: the earlier attempt's steps are in the same file.
    ASSERT_TRUE(wait_for_event(
        dir / "ckpt", "step",
        [&](const json& e) {
          return e.value("time", 0.0) >= started &&
                 e.value("global_step", int64_t{0}) >= 60 * (attempt + 1);
        },
        pid));
    sleep_for(4);
    kill(pid, attempt == 1 ? SIGINT : SIGTERM);
    if (attempt == 1) {
      sleep_for(0.5);
      kill(pid, SIGINT);
    }
    const Result r = wait_gpurun(pid, log);
    ASSERT_EQ(r.exit_code, 75) << r.err;
    if (attempt == 1) EXPECT_TRUE(contains(r.err, "second interrupt at global step")) << r.err;
    wall += attempt_seconds(started);
  }
  const double started = unix_now();
  Result last = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt", "--resume"}, sets), slow);
  ASSERT_EQ(last.exit_code, 0) << last.err;
  wall += attempt_seconds(started);
  ASSERT_EQ(events(dir / "ckpt", "done").size(), 3u);
  const json status = json::parse(slurp(dir / "ckpt/status.json"));
  const json cost = status["cost"];
  EXPECT_EQ(cost["attempts"], 3);
  EXPECT_NEAR(cost["seconds"].get<double>(), wall, 0.02 * wall) << cost.dump();
  EXPECT_NEAR(cost["spent"].get<double>(), wall / 100, 0.02 * wall / 100) << cost.dump();
  EXPECT_EQ(cost["price_source"], "cost.price_per_hour");
  // The final checkpoint records the three attempts.
  const json attempts = inspect(dir / "ckpt")["extra"]["cost"]["attempts"];
  EXPECT_EQ(attempts.size(), 3u);
  // gpurun status says it in words.
  Result shown = run_gpurun({"status", dir / "ckpt"});
  EXPECT_TRUE(contains(shown.out, "spent, ")) << shown.out;
  EXPECT_TRUE(contains(shown.out, "over 3 attempts")) << shown.out;
  // The report draws the spend on its time axis, across the three attempts.
  Result report = run_gpurun({"report", dir / "ckpt", "--out", dir / "report.html"});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  const std::string page = slurp(dir / "report.html");
  EXPECT_TRUE(contains(page, "Cost over time"));
  EXPECT_TRUE(contains(page, "spent, all attempts"));
}

TEST(Cost, TheBudgetStopsWithACheckpointAndOnlyALargerOneResumesExactly) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(3000, 10, 1));
  Result reference = run_gpurun({config, "--ckpt", dir / "reference"});
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  // One unit of money a second: the budget is spent after about 8 s of this run.
  const double budget = 8;
  const std::vector<std::string> sets{"cost.price_per_hour=3600", "log.every_steps=1"};
  const Env slow{{"GPURUN_FAULT", "sleep60:after_step:*"}};
  const auto with_budget = [&](std::vector<std::string> args, const char* budget_set) {
    std::vector<std::string> all = sets;
    all.push_back(budget_set);
    return with_sets(std::move(args), all);
  };
  Result r = run_gpurun(with_budget({config, "--ckpt", dir / "ckpt"}, "cost.budget=8"), slow);
  const int64_t stop = budget_stop_step(r, dir / "ckpt", "8.00", 300);
  ASSERT_GT(stop, 0);
  // Its ledger is within the budget.
  const json manifest = inspect(dir / "ckpt");
  double spent = 0;
  for (const json& a : manifest["extra"]["cost"]["attempts"]) spent += a["seconds"].get<double>();
  EXPECT_LE(spent, budget);
  // Not early either: the stop came when the next step and a save (1 s assumed, or the measured
  // one) would pass it, so what is left is at most a few steps and a save.
  const std::vector<json> steps = events(dir / "ckpt", "step");
  double longest = 0;
  for (size_t i = 1; i < steps.size(); ++i)
    longest =
        std::max(longest, steps[i]["time"].get<double>() - steps[i - 1]["time"].get<double>());
  EXPECT_GE(spent + 2 * longest + 1.5, budget) << "spent " << spent << ", longest step " << longest;
  // The same budget: refused at once, nothing trained.
  Result same =
      run_gpurun(with_budget({config, "--ckpt", dir / "ckpt", "--resume"}, "cost.budget=8"));
  EXPECT_EQ(same.exit_code, 4) << same.err;
  EXPECT_TRUE(contains(same.err, "raise it")) << same.err;
  EXPECT_EQ(inspect(dir / "ckpt")["global_step"], stop);
  // A larger one: the run goes on to the end, bit for bit the uninterrupted run.
  Result more =
      run_gpurun(with_budget({config, "--ckpt", dir / "ckpt", "--resume"}, "cost.budget=1000"));
  ASSERT_EQ(more.exit_code, 0) << more.err;
  EXPECT_EQ(inspect(dir / "ckpt")["model_digest"], inspect(dir / "reference")["model_digest"]);
}

// Two ranks, each a card-hour at 3600: two units a second. Rank 0 projects the spend and the
// ranks agree through the gradient sync, so both stop after the same step: one checkpoint at
// the stop's step, exit 4 from the launcher (no rank left waiting in a collective), and a
// resume with a larger budget ends at the uninterrupted two-rank run's digest.
TEST(Cost, TwoRanksStopForTheBudgetAtOneStepAndResumeExactly) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(3000, 20, 1));
  const auto two = [](std::vector<std::string> args) {
    args.insert(args.end(), {"--nproc-per-node", "2"});
    return args;
  };
  Result reference = run_gpurun(two({config, "--ckpt", dir / "reference"}));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const auto with_budget = [&](std::vector<std::string> args, const std::string& budget) {
    return two(with_sets(std::move(args), {"cost.price_per_hour=3600", "log.every_steps=1",
                                           "cost.budget=" + budget}));
  };
  // 100 ms a step: 150 steps are 15 s, and the budget is 10 s of the two ranks' wall time, of
  // which a loaded machine's start-up may take 3 s before the first step.
  const Env slow{{"GPURUN_FAULT", "sleep100:after_step:*"}};
  Result r = run_gpurun(with_budget({config, "--ckpt", dir / "ckpt"}, "20"), slow);
  const int64_t stop = budget_stop_step(r, dir / "ckpt", "20.00", 150);
  ASSERT_GT(stop, 0);
  const json manifest = inspect(dir / "ckpt");
  double spent = 0;
  for (const json& a : manifest["extra"]["cost"]["attempts"]) {
    EXPECT_EQ(a.value("ranks", 0), 2) << a.dump();
    spent += a["seconds"].get<double>() * a["ranks"].get<double>();
  }
  EXPECT_LE(spent, 20.0);
  Result more = run_gpurun(with_budget({config, "--ckpt", dir / "ckpt", "--resume"}, "1000"));
  ASSERT_EQ(more.exit_code, 0) << more.err;
  EXPECT_TRUE(contains(more.err, "global step " + std::to_string(stop))) << more.err;
  EXPECT_EQ(inspect(dir / "ckpt")["model_digest"], inspect(dir / "reference")["model_digest"]);
}

// A budget that the start-up alone spends stops before the first step and says that nothing
// was trained or saved, rather than naming a checkpoint of step 0 that does not exist.
TEST(Cost, ABudgetSpentBeforeTheFirstStepSavesNothingAndSaysSo) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(300, 30, 1));
  Result r = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt"},
                                  {"cost.price_per_hour=3600", "cost.budget=0.01"}));
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_TRUE(contains(r.err, "before the first step")) << r.err;
  EXPECT_TRUE(contains(r.err, "nothing was trained or saved")) << r.err;
  EXPECT_FALSE(contains(r.err, "checkpoint of global step 0")) << r.err;
  EXPECT_FALSE(fs::exists(dir / "ckpt/LATEST"));
}

TEST(Cost, AStopCommandRunsAfterTheFinishedRunsMessage) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(300, 30, 1));
  const std::string marker = dir / "stopped";
  Result r = run_gpurun(with_sets({config, "--ckpt", dir / "ckpt"},
                                  {"cost.stop_command=echo $GPURUN_EXIT_CODE > " + marker +
                                   "; ls " + std::string(dir / "ckpt") + " >> " + marker}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string got = slurp(marker);
  EXPECT_EQ(got.substr(0, 2), "0\n") << got;
  EXPECT_TRUE(contains(got, "ckpt-e0001-s0000010")) << got;  // the final checkpoint was there
}

}  // namespace
}  // namespace gpurun::test

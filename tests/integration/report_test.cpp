// What a run reports while it trains and when it stops: samples/s and ETA measured over the
// real wall time (issue 16, defect 3), an immediate second interrupt that still records the
// stop (defect 5), the progress line on a terminal, the checkpoint a Ctrl-C wrote and the
// final loss in status.json (rough edge 12).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
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

/// The name LATEST holds, without the newline.
std::string latest_name(const std::string& ckpt) {
  std::string name = slurp(ckpt + "/LATEST");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name;
}

/// What a terminal shows after `bytes`: '\r' returns to the line's start, ESC[K erases to its
/// end, '\n' starts a new line, anything else overwrites the character under the cursor.
std::vector<std::string> screen(const std::string& bytes) {
  std::vector<std::string> lines{""};
  size_t col = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    std::string& line = lines.back();
    if (c == '\r') {
      col = 0;
    } else if (c == '\n') {
      lines.emplace_back();
      col = 0;
    } else if (c == '\033' && bytes.compare(i, 3, "\033[K") == 0) {
      line.resize(std::min(line.size(), col));
      i += 2;
    } else {
      if (col < line.size())
        line[col] = c;
      else
        line.push_back(c);
      ++col;
    }
  }
  return lines;
}

bool is_progress_line(const std::string& line) { return contains(line, " samples/s  ETA "); }

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

// Defect 5: a second SIGINT while the first one's save is being written stops at once, yet the
// stop is recorded: a signal and a done event with exit code 75, status.json "stopped" at the
// step reached and naming the newest complete checkpoint, and a message that says what is saved
// and to run again with --resume.
TEST(Signals, SecondInterruptStopsAtOnceAndStillRecordsTheStop) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(2048, 64, 50));
  const std::string ckpt = dir / "ckpt";
  // Slow steps, and saves that take 2 s to complete, so that the second interrupt lands in the
  // stop's save. It is sent once the first is seen: two signals sent before the process runs
  // again (a busy machine) would be one.
  pid_t pid = start_gpurun({config, "--ckpt", ckpt, "--set", "log.every_steps=10"}, dir / "run",
                           {{"GPURUN_FAULT", "sleep100:after_step:*,sleep2000:before_rename:*"}});
  ASSERT_TRUE(wait_for_new_checkpoint(ckpt, pid, "", 120));
  kill(pid, SIGINT);
  for (int i = 0; i < 1000 && !contains(slurp(dir / "run.err"), "received signal"); ++i)
    sleep_for(0.005);
  kill(pid, SIGINT);
  Result r = wait_gpurun(pid, dir / "run", 60);
  ASSERT_EQ(r.exit_code, 75) << r.err;
  EXPECT_TRUE(contains(r.err, "second interrupt")) << r.err;
  EXPECT_TRUE(contains(r.err, "--resume")) << r.err;
  const std::string newest = latest_name(ckpt);
  ASSERT_FALSE(newest.empty());
  EXPECT_TRUE(contains(r.err, newest)) << r.err;

  const auto signals = events(ckpt, "signal");
  ASSERT_FALSE(signals.empty());
  EXPECT_EQ(signals.back()["signal"], SIGINT);
  const auto done = events(ckpt, "done");
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]["exit_code"], 75);

  const nlohmann::json status = status_json(ckpt);
  EXPECT_EQ(status.value("state", ""), "stopped") << status.dump();
  EXPECT_EQ(status.value("global_step", -1), signals.back().value("global_step", -2));
  EXPECT_TRUE(contains(status.value("last_checkpoint", ""), newest)) << status.dump();
  Result shown = run_gpurun({"status", ckpt});
  EXPECT_TRUE(contains(shown.out, "stopped")) << shown.out;
  EXPECT_FALSE(contains(shown.out, "dead")) << shown.out;

  // The line the user is told to run continues the run.
  Result resumed = run_gpurun({config, "--ckpt", ckpt, "--resume", "--set", "log.every_steps=10",
                               "--set", "train.epochs=2"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
}

// Rough edge 12: on a terminal the progress line is cleared before every log line and drawn
// again after it, so that no stale progress line stays on the screen above the log.
TEST(Progress, ATerminalShowsNoStaleProgressLineAboveTheLog) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(640, 64, 3));
  // GPURUN_STDERR_TTY: stderr is treated as a terminal, as under the launcher.
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt", "--set", "log.every_steps=5"},
                        {{"GPURUN_STDERR_TTY", "1"}, {"GPURUN_FAULT", "sleep40:after_step:*"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(is_progress_line(r.err)) << "no progress line was drawn:\n" << r.err;
  const std::vector<std::string> lines = screen(r.err);
  int epoch_lines = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_FALSE(is_progress_line(lines[i]))
        << "line " << i << " of the screen is a stale progress line: " << lines[i];
    if (contains(lines[i], "train loss")) ++epoch_lines;
  }
  EXPECT_EQ(epoch_lines, 3);
  // Redrawn after the log line: what follows the first epoch's line is the progress line.
  const size_t epoch_line = r.err.find("epoch 1/3: train loss");
  ASSERT_NE(epoch_line, std::string::npos);
  size_t after = r.err.find('\n', epoch_line);
  ASSERT_NE(after, std::string::npos);
  ++after;
  if (r.err.compare(after, 4, "\r\033[K") == 0) after += 4;
  const std::string next = r.err.substr(after, r.err.find_first_of("\r\n", after) - after);
  EXPECT_TRUE(is_progress_line(next)) << next;
}

// Rough edge: the epoch's last progress line showed the loss of the epoch's short last batch
// alone (600 samples in batches of 64: a last batch of 24). It shows the epoch's mean so far,
// which at the epoch's end is the epoch line's train loss.
TEST(Progress, TheEpochsLastProgressLineShowsTheEpochsTrainLoss) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 64, 2));
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt"}, {{"GPURUN_STDERR_TTY", "1"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int epoch = 1; epoch <= 2; ++epoch) {
    const std::string marker = "epoch " + std::to_string(epoch) + "/2: train loss ";
    const size_t at = r.err.find(marker);
    ASSERT_NE(at, std::string::npos) << r.err;
    const std::string train_loss = r.err.substr(at + marker.size(), 6);  // "0.1234"
    // The last progress line drawn before the epoch line: its step is the epoch's last.
    const std::string step = "step " + std::to_string(10 * epoch) + "/20  loss ";
    const size_t line = r.err.rfind(step, at);
    ASSERT_NE(line, std::string::npos) << "no progress line of step " << 10 * epoch << ":\n"
                                       << r.err;
    EXPECT_EQ(r.err.substr(line + step.size(), 6), train_loss) << r.err.substr(line, 80);
  }
}

// Rough edge 12: a Ctrl-C names the checkpoint it wrote; a finished run's status.json holds
// the loss of its final step, not of the last logged one.
TEST(Progress, ACtrlCNamesItsCheckpointAndAFinishedStatusHoldsTheFinalLoss) {
  TempDir dir;
  {
    const std::string config = write_config(dir, small_config(2048, 64, 50));
    const std::string ckpt = dir / "stopped";
    pid_t pid = start_gpurun({config, "--ckpt", ckpt}, dir / "run",
                             {{"GPURUN_FAULT", "sleep50:after_step:*"}});
    ASSERT_TRUE(wait_for_new_checkpoint(ckpt, pid, "", 120));
    kill(pid, SIGINT);
    Result r = wait_gpurun(pid, dir / "run", 60);
    ASSERT_EQ(r.exit_code, 75) << r.err;
    const auto signals = events(ckpt, "signal");
    ASSERT_EQ(signals.size(), 1u);
    EXPECT_EQ(inspect(ckpt)["global_step"], signals[0]["global_step"]);
    EXPECT_TRUE(contains(r.err, latest_name(ckpt))) << r.err;
    EXPECT_EQ(status_json(ckpt).value("global_step", -1), signals[0].value("global_step", -2));
  }
  // 3 epochs of 8 steps: every step logged, against every 7th (the last logged step is 21).
  const std::string config = write_config(dir, small_config(512, 64, 3), "short.yaml");
  ASSERT_EQ(run_gpurun({config, "--ckpt", dir / "every"}).exit_code, 0);
  Result sparse = run_gpurun({config, "--ckpt", dir / "sparse", "--set", "log.every_steps=7"});
  ASSERT_EQ(sparse.exit_code, 0) << sparse.err;
  const auto steps = events(dir / "every", "step");
  ASSERT_EQ(steps.size(), 24u);
  const nlohmann::json status = status_json(dir / "sparse");
  EXPECT_EQ(status.value("global_step", -1), 24);
  EXPECT_DOUBLE_EQ(status.value("loss", -1.0), steps.back()["loss"].get<double>());
}

// Issue 31, item 8: status.json is written at most every 10 s, so a SIGKILLed run's was older
// than its metrics.jsonl, and `gpurun status` showed that older step.
TEST(Status, ASigkilledRunShowsTheLastStepOfItsMetricsNotOfAnOlderStatusJson) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(2048, 16, 1));
  const std::string ckpt = dir / "ckpt";
  const pid_t pid = start_gpurun({config, "--ckpt", ckpt}, dir / "run",
                                 {{"GPURUN_FAULT", "sleep20:after_step:*"}});
  // Killed at its fifth step event: well within the 10 s before status.json's next write.
  for (int i = 0; i < 1200 && events(ckpt, "step").size() < 5; ++i) sleep_for(0.05);
  ASSERT_GE(events(ckpt, "step").size(), 5u) << "no fifth step event in 60 s";
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  const Result killed = wait_gpurun(pid, dir / "run", 60);
  ASSERT_EQ(killed.signal, SIGKILL);
  const nlohmann::json last = events(ckpt, "step").back();
  ASSERT_LT(status_json(ckpt).value("global_step", int64_t{-1}),
            last.value("global_step", int64_t{0}))
      << "status.json caught up: the test shows nothing";
  const Result json = run_gpurun({"status", ckpt, "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json s = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(s.is_discarded()) << json.out;
  EXPECT_EQ(s.value("state", ""), "dead");
  EXPECT_EQ(s.value("global_step", int64_t{-1}), last.value("global_step", int64_t{-2}));
  EXPECT_EQ(s.value("epoch", int64_t{-1}), 0);
  EXPECT_DOUBLE_EQ(s.value("loss", -1.0), last.value("loss", -2.0));
  const Result text = run_gpurun({"status", ckpt});
  EXPECT_TRUE(contains(
      text.out,
      "step            " + std::to_string(last.value("global_step", int64_t{0})) + " of 128"))
      << text.out;
  EXPECT_TRUE(contains(text.out, "epoch           1 of 1")) << text.out;
}

// status.json's epoch is 0-based in every state, as metrics.jsonl's; a finished run wrote the
// count of epochs instead (2 for a run whose last epoch is 1).
TEST(Status, TheEpochIsZeroBasedWhileRunningAndOnceFinished) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(256, 64, 2));
  const Result r = run_gpurun({config, "--ckpt", dir / "ckpt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json status = status_json(dir / "ckpt");
  EXPECT_EQ(status.value("state", ""), "finished");
  EXPECT_EQ(status.value("epoch", int64_t{-1}), events(dir / "ckpt", "epoch").back()["epoch"]);
  EXPECT_EQ(status.value("epoch", int64_t{-1}), 1);
  EXPECT_EQ(status.value("epochs", int64_t{-1}), 2);
  const Result text = run_gpurun({"status", dir / "ckpt"});
  EXPECT_TRUE(contains(text.out, "epoch           2 of 2")) << text.out;
}

// The run directory's writes are a background thread's: a metrics.jsonl that blocks every write
// for good (a FIFO nobody reads: open(2) for writing never returns, as on a hung NFS mount)
// neither stalls training nor keeps the run from ending, and the checkpoints elsewhere are
// complete.
TEST(RunDirectory, AHungMetricsFileNeitherStallsTrainingNorKeepsTheRunFromEnding) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(1200, 40, 2));
  const std::string run_dir = dir / "run";
  ASSERT_EQ(::mkdir(run_dir.c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo((run_dir + "/metrics.jsonl").c_str(), 0644), 0);
  const auto start = std::chrono::steady_clock::now();
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt", "--run-dir", run_dir}, {}, 120);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(seconds, 60.0);
  EXPECT_TRUE(contains(r.err, "did not take the run's last records")) << r.err;
  EXPECT_TRUE(contains(r.err, "finished: 2 epochs")) << r.err;
  EXPECT_EQ(inspect(dir / "ckpt").value("global_step", 0), 60);
}

}  // namespace
}  // namespace gpurun::test

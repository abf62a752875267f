// Kill-and-resume with the real binary on real Fashion-MNIST data (issue 2; cases 1, 2, 7).
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;

/// The trace lines ("STEP EPOCH i i i ...") of GPURUN_TRACE_SAMPLES, in order.
std::vector<std::string> trace_lines(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

int64_t step_of(const std::string& trace_line) { return std::stoll(trace_line); }

/// Runs to completion without interruption; returns the final model_digest.
std::string uninterrupted_digest(const std::string& config, const std::vector<std::string>& sets,
                                 const std::string& trace = "") {
  TempDir ckpt;
  const std::vector<std::string> args = with_sets({config, "--ckpt", ckpt.path()}, sets);
  Env env;
  if (!trace.empty()) env["GPURUN_TRACE_SAMPLES"] = trace;
  Result r = run_gpurun(args, env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return inspect(ckpt.path()).value("model_digest", "");
}

TEST(KillResume, RandomSigkillsEndWithTheUninterruptedDigest) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(2400, 40, 3));
  const std::vector<std::string> sets{"checkpoint.every_steps=4", "model.hidden=[256,256]"};
  const std::string expected = uninterrupted_digest(config, sets);
  ASSERT_EQ(expected.size(), 16u);

  std::mt19937 rng(20261129);
  std::uniform_real_distribution<double> delay(0.0, 0.3);
  const std::string ckpt = dir / "ckpt";
  const std::vector<std::string> args = with_sets({config, "--ckpt", ckpt, "--resume"}, sets);
  // 20 ms a step in the processes to be killed: the kill, up to 0.3 s after a checkpoint, still
  // finds the run training however fast the machine (15 steps of the 4 to the next checkpoint
  // and more); the process after the last kill runs at full speed.
  const Env slow{{"GPURUN_FAULT", "sleep20:after_step:*"}};
  int kills = 0;
  for (int attempt = 0; attempt < 30; ++attempt) {
    const std::string before = slurp(ckpt + "/LATEST");
    pid_t pid = start_gpurun(args, dir / "run", kills < 5 ? slow : Env{});
    if (kills < 5 && wait_for_new_checkpoint(ckpt, pid, before)) {
      sleep_for(delay(rng));
      kill(pid, SIGKILL);
    }
    Result r = wait_gpurun(pid, dir / "run");
    if (r.exit_code == 0) break;
    ASSERT_EQ(r.signal, SIGKILL) << "exit " << r.exit_code << "\n" << r.err;
    ++kills;
  }
  EXPECT_GE(kills, 3);
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""), expected);
}

TEST(KillResume, SigkillDuringCheckpointWriteKeepsThePreviousOne) {
  // A wide MLP makes each checkpoint ~20 MB so that the write takes a while, and each write
  // holds its finished temporary folder 300 ms before the rename, so that a poll on a loaded
  // machine still sees it; the run is killed as soon as a temporary checkpoint folder appears
  // (while its files are written, or while it waits to be renamed).
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 2));
  const std::vector<std::string> sets{"model.hidden=[2048,512]", "checkpoint.every_steps=3",
                                      "optim.name=adam"};
  const std::string expected = uninterrupted_digest(config, sets);
  const std::string ckpt = dir / "ckpt";
  const std::vector<std::string> args = with_sets({config, "--ckpt", ckpt, "--resume"}, sets);
  int killed_in_write = 0;
  for (int attempt = 0; attempt < 20; ++attempt) {
    pid_t pid = start_gpurun(args, dir / "run", {{"GPURUN_FAULT", "sleep300:before_rename:*"}});
    bool killed = false;
    for (int i = 0; i < 3000 && killed_in_write < 3 && !killed; ++i) {
      if (fs::exists(ckpt)) {
        for (const auto& e : fs::directory_iterator(ckpt))
          if (e.path().filename().string().rfind(".tmp-ckpt", 0) == 0 && i > 0) {
            kill(pid, SIGKILL);
            killed = true;
            break;
          }
      }
      if (has_exited(pid)) break;
      sleep_for(0.002);
    }
    Result r = wait_gpurun(pid, dir / "run");
    if (killed) {
      ++killed_in_write;
      // The newest complete checkpoint still verifies after a kill mid-write.
      Result v = run_gpurun({"ckpt", "verify", ckpt});
      EXPECT_TRUE(v.exit_code == 0 || !fs::exists(ckpt / fs::path("LATEST"))) << v.out << v.err;
    }
    if (r.exit_code == 0) break;
  }
  EXPECT_GE(killed_in_write, 1);
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""), expected);
  for (const auto& e : fs::directory_iterator(ckpt))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos)
        << "leftover " << e.path();
}

// Case 1: 3 epochs x 10 steps, shuffled, checkpoint every 2 steps, SIGKILL at epoch 1 step 5.
TEST(Cases, MidEpochResumeNeitherLosesNorRepeatsData) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(300, 30, 3));
  const std::vector<std::string> sets{"checkpoint.every_steps=2"};
  const std::string expected = uninterrupted_digest(config, sets, dir / "full.trace");
  const auto full = trace_lines(dir / "full.trace");
  ASSERT_EQ(full.size(), 30u);

  const std::string ckpt = dir / "ckpt";
  // Epoch 1 step 5 is global step 15 (10 steps per epoch): killed right after it, before the
  // checkpoint every 2 steps would save it. Writes are asynchronous, so the newest complete
  // checkpoint holds 14 steps, or fewer when a write was still in flight.
  Result killed = run_gpurun(
      {config, "--ckpt", ckpt, "--set", sets[0]},
      {{"GPURUN_TRACE_SAMPLES", dir / "killed.trace"}, {"GPURUN_FAULT", "sigkill:after_step:16"}});
  ASSERT_EQ(killed.signal, SIGKILL) << killed.err;
  const int64_t saved_step = inspect(ckpt).value("global_step", -1);
  EXPECT_TRUE(saved_step >= 10 && saved_step <= 14 && saved_step % 2 == 0) << saved_step;
  Result resumed = run_gpurun({config, "--ckpt", ckpt, "--resume", "--set", sets[0]},
                              {{"GPURUN_TRACE_SAMPLES", dir / "resumed.trace"}});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;

  std::vector<std::string> combined;
  for (const auto& line : trace_lines(dir / "killed.trace"))
    if (step_of(line) < saved_step) combined.push_back(line);
  for (const auto& line : trace_lines(dir / "resumed.trace")) combined.push_back(line);
  EXPECT_EQ(combined, full);
  auto resume = events(ckpt, "resume");
  ASSERT_EQ(resume.size(), 1u);
  EXPECT_EQ(resume[0]["epoch"], 1);
  EXPECT_EQ(resume[0]["global_step"], saved_step);
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""), expected);
}

// Case 2: 3 epochs x 3 steps, killed right after epoch 0's checkpoint.
TEST(Cases, NoExtraStepAfterAnEndOfEpochCheckpoint) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(90, 30, 3));
  const std::string ckpt = dir / "ckpt";
  Result killed = run_gpurun({config, "--ckpt", ckpt}, {{"GPURUN_TRACE_SAMPLES", dir / "a.trace"},
                                                        {"GPURUN_FAULT", "sigkill:after_save:1"}});
  ASSERT_EQ(killed.signal, SIGKILL) << killed.err;
  Result resumed =
      run_gpurun({config, "--ckpt", ckpt, "--resume"}, {{"GPURUN_TRACE_SAMPLES", dir / "b.trace"}});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  // The killed process may have started epoch 1 while its checkpoint was written in the
  // background; that work is lost, not counted: the steps that make the final model are those
  // before the checkpoint plus those after the resume.
  std::vector<std::string> steps;
  for (const auto& line : trace_lines(dir / "a.trace"))
    if (step_of(line) < 3) steps.push_back(line);
  const auto after = trace_lines(dir / "b.trace");
  steps.insert(steps.end(), after.begin(), after.end());
  ASSERT_EQ(steps.size(), 9u);
  for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(step_of(steps[i]), i);
  EXPECT_EQ(after.front().substr(0, 4), "3 1 ");  // global step 3, epoch 1
  auto resume = events(ckpt, "resume");
  ASSERT_EQ(resume.size(), 1u);
  EXPECT_EQ(resume[0]["epoch"], 1);
  EXPECT_EQ(resume[0]["global_step"], 3);
  EXPECT_EQ(inspect(ckpt).value("global_step", -1), 9);
}

// Case 7: a large checkpoint, SIGKILL at random points over many saves, --resume after each.
TEST(Cases, TruncatedCheckpointNeverBlocksResume) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(480, 24, 1));
  const std::vector<std::string> sets{"model.hidden=[2048,1024]", "checkpoint.every_steps=1",
                                      "optim.name=adam"};
  const std::string ckpt = dir / "ckpt";
  const std::vector<std::string> args = with_sets({config, "--ckpt", ckpt, "--resume"}, sets);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> delay(0.0, 0.5);
  // 100 ms a step: the kill, up to 0.5 s after a new checkpoint, lands while the run trains and
  // saves (every step), not after it finished on a fast machine.
  const Env slow{{"GPURUN_FAULT", "sleep100:after_step:*"}};
  int64_t last_step = 0;
  int kills = 0;
  for (int attempt = 0; attempt < 12 && kills < 8; ++attempt) {
    const std::string before = slurp(ckpt + "/LATEST");
    pid_t pid = start_gpurun(args, dir / "run", slow);
    if (wait_for_new_checkpoint(ckpt, pid, before)) sleep_for(delay(rng));
    kill(pid, SIGKILL);
    Result r = wait_gpurun(pid, dir / "run");
    if (r.exit_code == 0) break;
    ASSERT_EQ(r.signal, SIGKILL) << r.err;
    ++kills;
    if (!fs::exists(ckpt / fs::path("LATEST"))) continue;
    // Every resume finds a complete checkpoint: the previous or the new one, never a torn one.
    Result v = run_gpurun({"ckpt", "verify", ckpt, "--json"});
    EXPECT_EQ(v.exit_code, 0) << v.out;
    const int64_t step = inspect(ckpt).value("global_step", -1);
    EXPECT_GE(step, last_step);
    last_step = step;
  }
  EXPECT_GE(kills, 4);
  Result done = run_gpurun(args);
  ASSERT_EQ(done.exit_code, 0) << done.err;
  EXPECT_EQ(inspect(ckpt).value("global_step", -1), 20);
  EXPECT_EQ(done.err.find("damaged"), std::string::npos) << done.err;
}

/// For each global step of RUN_DIR's `event` events, the last value of `field`: the series a
/// reader keeps of a resumed run (a killed process's events after its checkpoint are logged
/// again by the next one).
std::map<int64_t, double> series(const std::string& run_dir, const std::string& event,
                                 const std::string& field) {
  std::map<int64_t, double> out;
  for (const auto& e : events(run_dir, event))
    out[e["global_step"].get<int64_t>()] = e[field].get<double>();
  return out;
}

/// A run of 2 epochs x 23 steps, a step event every 5 steps and a checkpoint every 7: the
/// intervals and the checkpoints fall apart, an interval spans each epoch end.
const std::vector<std::string> kIntervalSets{"log.every_steps=5", "checkpoint.every_steps=7"};

/// The resumed run `ckpt` logged what the uninterrupted `full` did: every step event's loss and
/// lr, every epoch's train_loss, and it ends with the same weights.
void expect_the_same_run(const std::string& ckpt, const std::string& full) {
  for (const char* field : {"loss", "lr"})
    EXPECT_EQ(series(ckpt, "step", field), series(full, "step", field)) << field;
  EXPECT_EQ(series(ckpt, "epoch", "train_loss"), series(full, "epoch", "train_loss"));
  EXPECT_EQ(inspect(ckpt)["model_digest"], inspect(full)["model_digest"]);
  expect_exact_resume_checks(ckpt);
}

// Issue 31 item 5: the first step event after a resume is the mean since the previous step
// event, of the steps before the checkpoint as well, so the logged curve is the uninterrupted
// one. Killed after step 30 with the checkpoint of step 28 complete (synchronous saves): the
// resumed event of step 30 is the mean of steps 26-30, not of 29-30.
TEST(ResumedSeries, TheLossAfterAResumeIsTheMeanSinceThePreviousStepEvent) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(230, 10, 2));
  std::vector<std::string> sets = kIntervalSets;
  sets.push_back("checkpoint.async=false");
  const std::string full = dir / "full";
  ASSERT_EQ(run_gpurun(with_sets({config, "--ckpt", full}, sets)).exit_code, 0);
  const std::string ckpt = dir / "ckpt";
  Result killed = run_gpurun(with_sets({config, "--ckpt", ckpt}, sets),
                             {{"GPURUN_FAULT", "sigkill:after_step:30"}});
  ASSERT_EQ(killed.signal, SIGKILL) << killed.err;
  ASSERT_EQ(inspect(ckpt)["global_step"], 28);
  Result resumed = run_gpurun(with_sets({config, "--ckpt", ckpt, "--resume"}, sets));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  ASSERT_EQ(events(ckpt, "resume").size(), 1u);

  const auto expected = series(full, "step", "loss");
  ASSERT_EQ(expected.size(), 9u);  // steps 5, 10, ..., 45
  const auto got = series(ckpt, "step", "loss");
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got.at(30), expected.at(30)) << "the first event after the resume";
  expect_the_same_run(ckpt, full);
}

// Every resume checks itself: the steps a killed run logged after its checkpoint are trained
// again, and with the same config, plan, threads and CPU an exact resume logs the same bits.
// A run that saves every 7 steps and logs every step, SIGKILLed once its step 30 is logged:
// steps 29, 30 and any later one logged before the kill are compared. A metrics.jsonl whose
// logged loss of step 29 is one ulp off stands for a resume that is not exact: the check names
// the step and both values, warns, and the run goes on.
TEST(ResumeCheck, TheStepsTheKilledRunLoggedAfterItsCheckpointAreComparedBitForBit) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(460, 10, 1));
  const std::vector<std::string> sets{"checkpoint.every_steps=7", "checkpoint.async=false"};
  const std::string ckpt = dir / "ckpt", edited = dir / "edited";
  // 20 ms a step, and a pause before step 32 is logged: the kill finds the run between steps 30
  // and 32, before step 35's save, however late it comes.
  const pid_t pid =
      start_gpurun(with_sets({config, "--ckpt", ckpt}, sets), dir / "killed",
                   {{"GPURUN_FAULT", "sleep20:after_step:*,sleep300000:after_step:32"}});
  ASSERT_TRUE(wait_for_step(ckpt, 30, pid));
  kill(pid, SIGKILL);
  ASSERT_EQ(wait_gpurun(pid, dir / "killed").signal, SIGKILL);
  ASSERT_EQ(inspect(ckpt)["global_step"], 28);
  int64_t last_logged = 0;
  for (const auto& e : events(ckpt, "step")) last_logged = e["global_step"].get<int64_t>();
  fs::copy(ckpt, edited, fs::copy_options::recursive);

  Result resumed = run_gpurun(with_sets({config, "--ckpt", ckpt, "--resume"}, sets));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  auto checks = events(ckpt, "resume_check");
  ASSERT_EQ(checks.size(), 1u) << resumed.err;
  EXPECT_EQ(checks[0]["exact"], true);
  EXPECT_EQ(checks[0]["compared_steps"], last_logged - 28);
  EXPECT_EQ(checks[0]["first_step"], 29);
  EXPECT_EQ(checks[0]["last_step"], last_logged);
  EXPECT_TRUE(contains(resumed.err, "bit for bit")) << resumed.err;

  // The killed run's step 29 as if it had computed one ulp more.
  std::string metrics = slurp(edited + "/metrics.jsonl");
  double logged = 0;
  for (const auto& e : events(edited, "step"))
    if (e["global_step"] == 29) logged = e["loss"].get<double>();
  ASSERT_GT(logged, 0);
  const std::string was = "\"loss\":" + nlohmann::json(logged).dump();
  const double off = std::nextafter(logged, 2 * logged);
  const size_t at = metrics.find(was);
  ASSERT_NE(at, std::string::npos) << was;
  metrics.replace(at, was.size(), "\"loss\":" + nlohmann::json(off).dump());
  std::ofstream(edited + "/metrics.jsonl", std::ios::binary | std::ios::trunc) << metrics;
  const InexactResumeExpected expected;
  Result warned = run_gpurun(with_sets({config, "--ckpt", edited, "--resume"}, sets));
  ASSERT_EQ(warned.exit_code, 0) << warned.err;
  checks = events(edited, "resume_check");
  ASSERT_EQ(checks.size(), 1u) << warned.err;
  EXPECT_EQ(checks[0]["exact"], false);
  EXPECT_EQ(checks[0]["global_step"], 29);
  EXPECT_EQ(checks[0]["logged_loss"].get<double>(), off);
  EXPECT_EQ(checks[0]["loss"].get<double>(), logged);
  EXPECT_TRUE(contains(warned.err, "resume check: at global step 29")) << warned.err;
  EXPECT_TRUE(contains(warned.err, "not bit-exact")) << warned.err;
  EXPECT_EQ(inspect(edited)["model_digest"], inspect(ckpt)["model_digest"]);
}

// Where the two processes compute with other numerics (here another thread count, another
// log.every_steps, a longer schedule) equal losses are not to be expected: nothing is compared,
// and a resume_check event and a line say why. With nothing changed, the same kill and resume
// are checked.
TEST(ResumeCheck, NothingIsComparedWhenTheNumericsDiffer) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(230, 10, 1));
  const std::vector<std::string> sets{"checkpoint.every_steps=7", "checkpoint.async=false"};
  for (const std::string change : {"", "train.threads=2", "log.every_steps=2", "train.epochs=2"}) {
    SCOPED_TRACE("changed: " + change);
    const std::string ckpt = dir / ("ckpt-" + change);
    // Paused before step 11 is logged: the kill comes before step 14's save.
    const pid_t pid =
        start_gpurun(with_sets({config, "--ckpt", ckpt}, sets), ckpt + "-killed",
                     {{"GPURUN_FAULT", "sleep20:after_step:*,sleep300000:after_step:11"}});
    ASSERT_TRUE(wait_for_step(ckpt, 9, pid));
    kill(pid, SIGKILL);
    ASSERT_EQ(wait_gpurun(pid, ckpt + "-killed").signal, SIGKILL);
    std::vector<std::string> resume = with_sets({config, "--ckpt", ckpt, "--resume"}, sets);
    if (!change.empty()) resume.insert(resume.end(), {"--set", change});
    Result resumed = run_gpurun(resume);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_EQ(events(ckpt, "resume").size(), 1u);
    const auto checks = events(ckpt, "resume_check");
    ASSERT_EQ(checks.size(), 1u);
    if (change.empty()) {
      EXPECT_EQ(checks[0]["exact"], true) << checks[0].dump();
      continue;
    }
    EXPECT_FALSE(checks[0].contains("exact")) << checks[0].dump();
    EXPECT_EQ(checks[0]["compared_steps"], 0);
    EXPECT_GE(checks[0]["logged_steps"].get<int64_t>(), 2);  // steps 8 and 9 at least
    EXPECT_TRUE(contains(checks[0]["reason"].get<std::string>(), "other numerics"))
        << checks[0].dump();
    EXPECT_TRUE(contains(resumed.err, "are not compared: the stopped run computed with other"))
        << resumed.err;
  }
}

// Two runs logging into one --run-dir: resuming the first is never compared with the second's
// steps, though they were logged last (the run's id is part of the numerics).
TEST(ResumeCheck, AnotherRunInTheSameRunDirIsNotComparedWith) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(230, 10, 1));
  const std::string run_dir = dir / "runs";
  const std::vector<std::string> sets{"checkpoint.every_steps=7", "checkpoint.async=false",
                                      "train.seed=8"};
  for (const std::string name : {"a", "b"}) {
    std::vector<std::string> args = {config, "--ckpt", dir / name, "--run-dir", run_dir};
    if (name == "b")
      args = with_sets(args, sets);  // another seed: other losses
    else
      args = with_sets(args, {sets[0], sets[1]});
    // This process's events only: the other run's are in the same file.
    const double started = unix_now();
    // Paused before step 11 is logged: the kill comes before step 14's save.
    const pid_t pid =
        start_gpurun(args, dir / (name + "-killed"),
                     {{"GPURUN_FAULT", "sleep20:after_step:*,sleep300000:after_step:11"}});
    ASSERT_TRUE(wait_for_event(
        run_dir, "step",
        [&](const nlohmann::json& e) {
          return e.value("time", 0.0) >= started && e.value("global_step", int64_t{0}) >= 9;
        },
        pid));
    kill(pid, SIGKILL);
    ASSERT_EQ(wait_gpurun(pid, dir / (name + "-killed")).signal, SIGKILL);
  }
  Result resumed = run_gpurun(with_sets(
      {config, "--ckpt", dir / "a", "--run-dir", run_dir, "--resume"}, {sets[0], sets[1]}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto checks = events(run_dir, "resume_check");
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_FALSE(checks[0].contains("exact")) << checks[0].dump();
  EXPECT_TRUE(contains(checks[0]["reason"].get<std::string>(), "other numerics"));
}

// Issue 31 item 4: train.epochs below the checkpoint is refused (exit 3, never retried), equal
// to it finishes at once with that checkpoint as the final one, above it extends the run.
TEST(ResumedLength, FewerEpochsThanTheCheckpointHasDoneAreRefusedWithExit3) {
  TempDir dir;
  // 3 steps an epoch; stopped by SIGTERM after step 4: a checkpoint 30 samples into epoch 1.
  const std::string config = write_config(dir, small_config(90, 30, 3));
  const std::string ckpt = dir / "ckpt";
  Result stopped = run_gpurun({config, "--ckpt", ckpt}, {{"GPURUN_FAULT", "sigterm:after_step:4"}});
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  ASSERT_EQ(inspect(ckpt)["global_step"], 4);
  const std::string metrics = slurp(ckpt + "/metrics.jsonl");
  const std::string latest = slurp(ckpt + "/LATEST");

  // One epoch is 3 steps: fewer than the 4 done. Epoch 1 unfinished: at least 2 epochs.
  for (const std::string restarts : {"0", "2"}) {
    Result lower = run_gpurun({config, "--ckpt", ckpt, "--resume", "--set", "train.epochs=1",
                               "--max-restarts", restarts});
    EXPECT_EQ(lower.exit_code, 3) << lower.err;
    for (const char* part : {"train.epochs 1 gives 3 optimizer steps", "global step 4",
                             "in epoch 1, 30 samples into it", "at least 2"})
      EXPECT_TRUE(contains(lower.err, part)) << part << "\n" << lower.err;
    EXPECT_FALSE(contains(lower.err, "restarting")) << lower.err;
  }
  // Refused before it started: the run's files are as they were.
  EXPECT_EQ(slurp(ckpt + "/metrics.jsonl"), metrics);
  EXPECT_EQ(slurp(ckpt + "/LATEST"), latest);

  // Two epochs finish epoch 1 (6 steps); then the same total again has nothing left to train.
  Result two = run_gpurun({config, "--ckpt", ckpt, "--resume", "--set", "train.epochs=2"});
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_EQ(inspect(ckpt)["global_step"], 6);
  EXPECT_EQ(trimmed(slurp(ckpt + "/LATEST")), "ckpt-e0002-s0000006");
  Result same = run_gpurun({config, "--ckpt", ckpt, "--resume", "--set", "train.epochs=2"});
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_TRUE(contains(same.err, "nothing left to train")) << same.err;
  EXPECT_EQ(trimmed(slurp(ckpt + "/LATEST")), "ckpt-e0002-s0000006");
  EXPECT_EQ(events(ckpt, "checkpoint").back()["global_step"], 6);
  const nlohmann::json status = nlohmann::json::parse(slurp(ckpt + "/status.json"));
  EXPECT_EQ(status["state"], "finished");
  EXPECT_EQ(status["global_step"], 6);
  EXPECT_EQ(status["total_steps"], 6);

  // Below a finished run's end-of-epoch checkpoint: refused as well, naming its epochs.
  Result below = run_gpurun({config, "--ckpt", ckpt, "--resume", "--set", "train.epochs=1"});
  EXPECT_EQ(below.exit_code, 3) << below.err;
  EXPECT_TRUE(contains(below.err, "global step 6 (after 2 epochs)")) << below.err;
  EXPECT_TRUE(contains(below.err, "at least 2")) << below.err;
}

// A cosine schedule decays over the total of optimizer steps: another train.epochs on a resume
// changes its curve from there on, which is said with both totals; growing train.epochs to
// extend a finished run stays allowed. A schedule that ignores the total is not warned about.
TEST(ResumedLength, AnotherTotalOfStepsIsWarnedAboutUnderACosineSchedule) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(60, 30, 3));  // 2 steps an epoch
  const std::vector<std::string> cosine{"schedule.name=cosine"};
  const std::string ckpt = dir / "ckpt";
  Result stopped = run_gpurun(with_sets({config, "--ckpt", ckpt}, cosine),
                              {{"GPURUN_FAULT", "sigterm:after_step:3"}});
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;

  // Lowered mid-run: 4 steps instead of 6.
  Result lower = run_gpurun(
      with_sets({config, "--ckpt", ckpt, "--resume", "--set", "train.epochs=2"}, cosine));
  ASSERT_EQ(lower.exit_code, 0) << lower.err;
  for (const char* part : {"warning", "the run has 4 optimizer steps instead of 6",
                           "learning-rate curve changes from global step 3"})
    EXPECT_TRUE(contains(lower.err, part)) << part << "\n" << lower.err;
  EXPECT_EQ(inspect(ckpt)["global_step"], 4);

  // A finished run extended: 8 steps instead of 4.
  Result extended = run_gpurun(
      with_sets({config, "--ckpt", ckpt, "--resume", "--set", "train.epochs=4"}, cosine));
  ASSERT_EQ(extended.exit_code, 0) << extended.err;
  EXPECT_TRUE(contains(extended.err, "the run has 8 optimizer steps instead of 4")) << extended.err;
  EXPECT_TRUE(contains(extended.err, "learning-rate curve changes from global step 4"))
      << extended.err;
  EXPECT_EQ(inspect(ckpt)["global_step"], 8);

  // The same total again: nothing to say.
  Result same = run_gpurun(
      with_sets({config, "--ckpt", ckpt, "--resume", "--set", "train.epochs=4"}, cosine));
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_FALSE(contains(same.err, "optimizer steps instead of")) << same.err;

  // A constant schedule: the totals are said, the curve is not warned about.
  const std::string flat = dir / "flat";
  ASSERT_EQ(run_gpurun({config, "--ckpt", flat}).exit_code, 0);
  Result longer = run_gpurun({config, "--ckpt", flat, "--resume", "--set", "train.epochs=4"});
  ASSERT_EQ(longer.exit_code, 0) << longer.err;
  EXPECT_TRUE(contains(longer.err, "the run has 8 optimizer steps instead of 6")) << longer.err;
  EXPECT_FALSE(contains(longer.err, "learning-rate curve changes")) << longer.err;
}

}  // namespace
}  // namespace gpurun::test

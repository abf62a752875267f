// `gpurun queue` on the real binary (queue/queue_runner.h): a queue SIGKILLed mid-run and
// started again trains every run exactly once, --parallel runs at once, a failed run does not
// stop the others, a restart after exit 1 or a hang, a stop signal and a second queue on a live
// DIR, a run stopped alone, and a typo in the queue file.
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

/// 20 ms after every optimizer step: a run of 60 steps lasts >= 1.2 s, long enough to be
/// killed in on any machine.
const Env kSlow{{"GPURUN_FAULT", "sleep20:after_step:*"}};

/// 80 ms after every optimizer step: a run of 60 steps lasts >= 4.8 s, where a test does more
/// between a checkpoint and its kill than a loaded machine does in kSlow's 0.8 s.
const Env kSlower{{"GPURUN_FAULT", "sleep80:after_step:*"}};

nlohmann::json read_json(const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(slurp(path), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << path << " is not JSON";
  return j;
}

/// queue.json's record of the run `name`.
nlohmann::json run_record(const std::string& dir, const std::string& name) {
  const nlohmann::json queue = read_json(dir + "/queue.json");
  for (const nlohmann::json& r : queue["runs"])
    if (r.value("name", "") == name) return r;
  ADD_FAILURE() << "no run " << name << " in " << dir << "/queue.json";
  return {};
}

std::vector<int64_t> epochs_of(const std::string& run_dir) {
  std::vector<int64_t> out;
  for (const nlohmann::json& e : events(run_dir, "epoch")) out.push_back(e.value("epoch", -1));
  return out;
}

/// The queue of `seeds` over `config`, written beside it.
std::string seeds_queue(const TempDir& dir, const std::string& config, const std::string& seeds,
                        const std::string& more = "") {
  return write_config(dir, "config: " + config + "\nseeds: [" + seeds + "]\n" + more, "q.yaml");
}

/// The unix start time of each attempt, from the header line the queue writes into the run's
/// stderr.log ("gpurun queue: starting NAME (attempt 1, ...) on cpu at SECONDS: COMMAND").
std::vector<double> attempt_starts(const std::string& stderr_log) {
  std::vector<double> out;
  std::istringstream lines(slurp(stderr_log));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("gpurun queue: ", 0) != 0) continue;
    const size_t at = line.find(" at ");
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + 4)));
  }
  return out;
}

TEST(Queue, SigkilledDuringItsSecondRunContinuesAndTrainsEachRunOnce) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(400, 20, 3));
  const std::string queue = seeds_queue(dir, config, "1, 2, 3");
  const std::string qdir = dir / "q";
  const std::vector<std::string> args{"queue", queue, "--dir", qdir};
  // 80 ms a step: seed-2's last two epochs take 3.2 s, in which the checks below and the kill
  // must fall (at kSlow's 20 ms they took 0.8 s, and a loaded machine once let seed-2 finish
  // first); it still writes an event every step, which the wall time below counts up to.
  const pid_t pid = start_gpurun(args, dir / "first", kSlower);
  // The second run's first checkpoint (end of its first epoch), then the whole group.
  ASSERT_TRUE(wait_for_new_checkpoint(qdir + "/runs/seed-2", pid, "", 120));
  ASSERT_EQ(run_record(qdir, "seed-1").value("state", ""), "finished");
  // A running run's wall time counts its running attempt (it showed 0s until the attempt ended).
  const nlohmann::json live =
      nlohmann::json::parse(run_gpurun({"status", qdir, "--json"}).out, nullptr, false);
  ASSERT_FALSE(live.is_discarded());
  ASSERT_EQ(live["runs"][1].value("state", ""), "running");
  EXPECT_GT(live["runs"][1]["summary"].value("wall_seconds", 0.0), 0.5) << live["runs"][1].dump();
  ASSERT_EQ(kill(-pid, SIGKILL), 0);
  const double killed_at = unix_now();
  const Result killed = wait_gpurun(pid, dir / "first");
  EXPECT_EQ(killed.signal, SIGKILL);
  EXPECT_EQ(run_record(qdir, "seed-2").value("state", ""), "running");
  const double first_start = run_record(qdir, "seed-2").value("started", 0.0);
  // gpurun status sees that the queue is gone: its running run is interrupted.
  const Result gone = run_gpurun({"status", qdir});
  EXPECT_EQ(gone.exit_code, 0) << gone.err;
  EXPECT_TRUE(contains(gone.out, "not running")) << gone.out;
  EXPECT_TRUE(contains(gone.out, "interrupted")) << gone.out;
  EXPECT_TRUE(contains(gone.out, "runs are left")) << gone.out;
  const nlohmann::json after =
      nlohmann::json::parse(run_gpurun({"status", qdir, "--json"}).out, nullptr, false);
  ASSERT_FALSE(after.is_discarded());
  EXPECT_GE(after["runs"][1]["summary"].value("wall_seconds", 0.0), killed_at - first_start - 0.5)
      << after["runs"][1].dump();

  // The same command: its child waits for the killed queue's child to save and let the lease go.
  const pid_t again = start_gpurun(args, dir / "second", kSlow);
  const Result r = wait_gpurun(again, dir / "second", 180);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"seed-1", "seed-2", "seed-3"})
    EXPECT_EQ(run_record(qdir, name).value("state", ""), "finished") << name;

  // Run 1 trained once: every epoch once, never resumed, never started again.
  const std::string run1 = qdir + "/runs/seed-1";
  EXPECT_EQ(epochs_of(run1), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(events(run1, "resume").empty());
  EXPECT_EQ(events(run1, "done").size(), 1u);
  EXPECT_EQ(run_record(qdir, "seed-1").value("attempts", 0), 1);
  // Run 2 resumed at the checkpoint it had: the last one committed before the resume.
  const std::string run2 = qdir + "/runs/seed-2";
  const std::vector<nlohmann::json> resumes = events(run2, "resume");
  ASSERT_EQ(resumes.size(), 1u);
  int64_t last_saved = -1;
  std::istringstream lines(slurp(run2 + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.value("event", "") == "resume") break;
    if (j.value("event", "") == "checkpoint") last_saved = j.value("global_step", int64_t{-1});
  }
  // The killed queue's child got SIGTERM (PR_SET_PDEATHSIG), saved and exited 75 by itself.
  const std::vector<nlohmann::json> signals = events(run2, "signal");
  ASSERT_EQ(signals.size(), 1u);
  EXPECT_EQ(signals[0].value("signal", 0), SIGTERM);
  const std::vector<nlohmann::json> dones = events(run2, "done");
  ASSERT_EQ(dones.size(), 2u);
  EXPECT_EQ(dones[0].value("exit_code", 0), 75);
  EXPECT_EQ(dones[1].value("exit_code", 1), 0);
  EXPECT_GE(last_saved, 20);  // at least the first epoch's 20 steps
  EXPECT_EQ(resumes[0].value("global_step", int64_t{-2}), last_saved);
  EXPECT_EQ(epochs_of(run2).back(), 2);
  EXPECT_EQ(run_record(qdir, "seed-2").value("attempts", 0), 2);
  // Its wall time holds both attempts: the one the SIGKILL cut short was lost.
  const nlohmann::json rec2 = run_record(qdir, "seed-2");
  const double second_start = attempt_starts(run2 + "/stderr.log").at(1);
  const double wall = rec2.value("wall_seconds", 0.0);
  EXPECT_GE(wall, (killed_at - first_start) + (rec2.value("ended", 0.0) - second_start) - 1.0)
      << rec2.dump();
  // (The killed queue's child may still save while the next queue starts its second attempt.)
  EXPECT_LE(wall, rec2.value("ended", 0.0) - first_start + 5.0) << rec2.dump();
  // Run 3 started fresh, once.
  const std::string run3 = qdir + "/runs/seed-3";
  EXPECT_TRUE(events(run3, "resume").empty());
  EXPECT_EQ(epochs_of(run3), (std::vector<int64_t>{0, 1, 2}));

  // The summary: three finished rows with their final evaluation.
  const nlohmann::json summary = read_json(qdir + "/summary.json");
  EXPECT_EQ(summary.value("finished", 0), 3);
  ASSERT_EQ(summary["runs"].size(), 3u);
  for (const nlohmann::json& row : summary["runs"]) {
    EXPECT_EQ(row.value("state", ""), "finished");
    EXPECT_TRUE(row["eval_loss"].is_number()) << row.dump();
    EXPECT_TRUE(row["eval_accuracy"].is_number()) << row.dump();
    EXPECT_EQ(row.value("epochs", 0), 3);
  }
  const std::string csv = slurp(qdir + "/summary.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4) << csv;
  EXPECT_TRUE(contains(csv, "seed-2,2,finished,0,0,")) << csv;
  EXPECT_TRUE(contains(r.out, "seed-3")) << r.out;

  // gpurun status DIR reads the queue directory.
  const Result status = run_gpurun({"status", qdir});
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_TRUE(contains(status.out, "not running")) << status.out;
  EXPECT_TRUE(contains(status.out, "seed-2")) << status.out;
  const Result json = run_gpurun({"status", qdir, "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << json.out;
  EXPECT_EQ(j["runs"].size(), 3u);
  EXPECT_EQ(j["runs"][1]["status"].value("state", ""), "finished");
}

TEST(Queue, ParallelTwoRunsTwoRunsAtOnce) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(300, 20, 2));
  // A config that leaves train.threads to the queue: it gets its share of the CPUs.
  std::string yaml = small_config(300, 20, 2);
  const std::string fixed = ", threads: 1";
  yaml.erase(yaml.find(fixed), fixed.size());
  write_config(dir, yaml, "open.yaml");
  const std::string queue =
      seeds_queue(dir, config, "1", "runs:\n  - {config: open.yaml, name: split}\n");
  const std::string qdir = dir / "q";
  const Result r = run_gpurun({"queue", queue, "--dir", qdir, "--parallel", "2"}, kSlow);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json a = run_record(qdir, "seed-1"), b = run_record(qdir, "split");
  const double start_a = a.value("started", 0.0), end_a = a.value("ended", 0.0);
  const double start_b = b.value("started", 0.0), end_b = b.value("ended", 0.0);
  ASSERT_GT(start_a, 0);
  ASSERT_GT(start_b, 0);
  // Both were running at the same moment: each started before the other ended.
  EXPECT_LT(start_a, end_b);
  EXPECT_LT(start_b, end_a);
  EXPECT_LT(std::max(start_a, start_b), std::min(end_a, end_b) - 0.5)
      << "the overlap should be most of a run";

  // Threads: the config's own 1 is kept; the open one gets max(1, CPUs / 2).
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(sched_getaffinity(0, sizeof cpus, &cpus), 0);
  const std::string share = "train.threads=" + std::to_string(std::max(1, CPU_COUNT(&cpus) / 2));
  EXPECT_TRUE(a["queue_set"].empty()) << a.dump();
  EXPECT_EQ(b["queue_set"], nlohmann::json::array({share})) << b.dump();
  EXPECT_TRUE(contains(slurp(qdir + "/runs/split/stderr.log"), "--set " + share));
}

TEST(Queue, ARunWithAConfigErrorIsReportedAndTheOthersFinish) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(200, 50, 1));
  const std::string queue =
      seeds_queue(dir, config, "1, 2", "runs:\n  - {set: [train.epoch=2], name: typo}\n");
  const std::string qdir = dir / "q";
  // Restarts are allowed, and still exit 2 is not retried.
  const Result r = run_gpurun({"queue", queue, "--dir", qdir, "--max-restarts", "2"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const nlohmann::json typo = run_record(qdir, "typo");
  EXPECT_EQ(typo.value("state", ""), "failed");
  EXPECT_EQ(typo.value("exit_code", 0), 2);
  EXPECT_EQ(typo.value("attempts", 0), 1);
  EXPECT_EQ(typo.value("restarts", -1), 0);
  EXPECT_TRUE(contains(typo.value("error", ""), "did you mean train.epochs?")) << typo.dump();
  EXPECT_TRUE(contains(r.err, "typo failed")) << r.err;
  for (const char* name : {"seed-1", "seed-2"})
    EXPECT_EQ(run_record(qdir, name).value("state", ""), "finished") << name;
  EXPECT_TRUE(contains(slurp(qdir + "/summary.csv"), "typo,,failed,2,0,"));

  // The typo corrected, the same command: the run that never saved takes its new definition
  // and trains; the finished ones are not trained again.
  seeds_queue(dir, config, "1, 2", "runs:\n  - {set: [train.epochs=2], name: typo}\n");
  const Result again = run_gpurun({"queue", queue, "--dir", qdir});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(run_record(qdir, "typo").value("state", ""), "finished");
  EXPECT_EQ(events(qdir + "/runs/typo", "epoch").size(), 2u);
  for (const char* name : {"seed-1", "seed-2"})
    EXPECT_EQ(events(qdir + "/runs/" + name, "epoch").size(), 1u) << name;
}

// It exited 1 ("mkdir ...: Read-only file system"), which a scheduler retries for ever.
TEST(Queue, AReadOnlyDirIsRefusedWithExit2AndGuidanceAsRunDoes) {
  Tmpfs disk("1m", true);
  if (!disk.ok()) GTEST_SKIP() << "mount(tmpfs) is not permitted here";
  TempDir dir;
  const std::string config = write_config(dir, small_config(100, 20, 1));
  const std::string queue = seeds_queue(dir, config, "1");
  for (const std::string& qdir : {disk.path(), disk.path() + "/q"}) {
    const Result r = run_gpurun({"queue", queue, "--dir", qdir});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "queue directory " + qdir + " cannot be written")) << r.err;
    EXPECT_TRUE(contains(r.err, "Read-only file system")) << r.err;
    EXPECT_TRUE(contains(r.err, "choose a --dir")) << r.err;
  }
}

TEST(Queue, ATypoInTheQueueFileNamesTheKeyAndStartsNothing) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(200, 50, 1));
  const std::string queue = write_config(dir, "config: " + config + "\nseed: [1, 2]\n", "q.yaml");
  const Result r = run_gpurun({"queue", queue, "--dir", dir / "q"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "unknown key seed")) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean seeds?")) << r.err;
  EXPECT_EQ(slurp(dir / "q/queue.json"), "");
}

TEST(Queue, ARunThatExits1IsRestartedWithResumeUpToMaxRestarts) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(200, 20, 1));
  // A checkpoint every 4 steps, so that the restart has one to resume from.
  const std::string queue = seeds_queue(dir, config, "1", "set: [checkpoint.every_steps=4]\n");
  // The first attempt of each run (GPURUN_RESTART_COUNT=0) exits 1 after step 9 of 10, when
  // the checkpoint of step 4 is committed (saves run in the background).
  const Env fails{{"GPURUN_FAULT", "exit1:after_step:9"}};
  const Result once = run_gpurun({"queue", queue, "--dir", dir / "q0"}, fails);
  EXPECT_EQ(once.exit_code, 1) << once.err;
  EXPECT_EQ(run_record(dir / "q0", "seed-1").value("state", ""), "failed");
  EXPECT_EQ(run_record(dir / "q0", "seed-1").value("exit_code", 0), 1);

  const Result r = run_gpurun({"queue", queue, "--dir", dir / "q1", "--max-restarts", "1"}, fails);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json rec = run_record(dir / "q1", "seed-1");
  EXPECT_EQ(rec.value("state", ""), "finished");
  EXPECT_EQ(rec.value("restarts", 0), 1);
  EXPECT_EQ(events(dir / "q1/runs/seed-1", "resume").size(), 1u);
}

TEST(Queue, AHungRunIsKilledAfterHangTimeoutAndRestarted) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(200, 20, 1));
  const std::string queue = seeds_queue(dir, config, "1");
  // The first attempt hangs after step 3 (for 10 minutes); the restart runs clean. 10 s: the
  // start-up before the first heartbeat counts, and a loaded machine may take 3 s.
  const Env hangs{{"GPURUN_FAULT", "sleep600000:after_step:3"}};
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run_gpurun(
      {"queue", queue, "--dir", dir / "q", "--max-restarts", "1", "--hang-timeout", "10"}, hangs);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(seconds, 60);
  EXPECT_TRUE(contains(r.err, "made no progress for 10 s")) << r.err;
  const nlohmann::json rec = run_record(dir / "q", "seed-1");
  EXPECT_EQ(rec.value("state", ""), "finished");
  EXPECT_EQ(rec.value("restarts", 0), 1);
  EXPECT_EQ(rec.value("attempts", 0), 2);
}

TEST(Queue, ASecondQueueOnALiveDirIsRefusedAndSigtermStopsTheQueueWith75) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(400, 20, 3));
  const std::string queue = seeds_queue(dir, config, "1, 2");
  const std::string qdir = dir / "q";
  const std::vector<std::string> args{"queue", queue, "--dir", qdir};
  // 150 ms a step: the first run lasts >= 9 s, 6 s of them after its first checkpoint, in which
  // the two gpurun processes below start and end even on a loaded machine.
  const pid_t pid = start_gpurun(args, dir / "first", {{"GPURUN_FAULT", "sleep150:after_step:*"}});
  ASSERT_TRUE(wait_for_new_checkpoint(qdir + "/runs/seed-1", pid, "", 120));
  const Result second = run_gpurun(args);
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_TRUE(contains(second.err, "used by a live gpurun queue")) << second.err;
  const Result live = run_gpurun({"status", qdir});
  EXPECT_TRUE(contains(live.out, "live (pid")) << live.out;
  EXPECT_TRUE(contains(live.out, "seed-1: epoch")) << live.out;

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const Result stopped = wait_gpurun(pid, dir / "first");
  EXPECT_EQ(stopped.exit_code, 75) << stopped.err;
  const nlohmann::json rec = run_record(qdir, "seed-1");
  EXPECT_EQ(rec.value("state", ""), "interrupted") << slurp(qdir + "/queue.json");
  EXPECT_EQ(rec.value("exit_code", 0), 75);
  EXPECT_EQ(run_record(qdir, "seed-2").value("state", ""), "pending");  // none started after

  const Result r = run_gpurun(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(events(qdir + "/runs/seed-1", "resume").size(), 1u);
  EXPECT_TRUE(events(qdir + "/runs/seed-2", "resume").empty());
}

TEST(Queue, ARunStoppedAloneIsLeftForTheNextInvocationAndTheOthersGoOn) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(400, 20, 3));
  const std::string queue = seeds_queue(dir, config, "1, 2");
  const std::string qdir = dir / "q";
  const std::vector<std::string> args{"queue", queue, "--dir", qdir, "--max-restarts", "3"};
  const pid_t pid = start_gpurun(args, dir / "first", kSlower);
  ASSERT_TRUE(wait_for_new_checkpoint(qdir + "/runs/seed-1", pid, "", 120));
  const int64_t child = run_record(qdir, "seed-1").value("pid", int64_t{0});
  ASSERT_GT(child, 0);
  ASSERT_EQ(kill(static_cast<pid_t>(child), SIGTERM), 0);  // that run alone, not the queue
  const Result first = wait_gpurun(pid, dir / "first");
  EXPECT_EQ(first.exit_code, 75) << first.err;  // a run is left to continue
  const nlohmann::json rec = run_record(qdir, "seed-1");
  EXPECT_EQ(rec.value("state", ""), "interrupted");
  EXPECT_EQ(rec.value("restarts", -1), 0);  // saved and stopped: not a failure to restart
  EXPECT_EQ(rec.value("attempts", 0), 1);
  EXPECT_EQ(run_record(qdir, "seed-2").value("state", ""), "finished");

  const Result r = run_gpurun(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(events(qdir + "/runs/seed-1", "resume").size(), 1u);
  EXPECT_EQ(run_record(qdir, "seed-2").value("attempts", 0), 1);
}

// Issue 31, item 3b: four bytes of a finished run's final model.pt changed. Export refuses it
// (exit 3) naming it and the one it could take, which --step exports; status and report say
// that they read no checksums and, once a file's size is wrong too, that the checkpoint is
// damaged; the queue's same command trains that run again from its newest good checkpoint, to
// the same final weights, and skips it only once its final checkpoint verifies.
TEST(Queue, AFinishedRunWhoseFinalCheckpointIsDamagedIsTrainedAgainFromItsNewestGoodOne) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(300, 30, 2));
  const std::string queue = seeds_queue(dir, config, "2", "set: [checkpoint.every_steps=4]\n");
  const std::string qdir = dir / "q";
  const std::vector<std::string> args{"queue", queue, "--dir", qdir};
  Result r = run_gpurun(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string run = qdir + "/runs/seed-2";
  const std::string final_ckpt = run + "/ckpt-e0002-s0000020";
  const std::string previous = run + "/ckpt-e0001-s0000016";
  const std::string digest = inspect(run).value("model_digest", "");
  ASSERT_EQ(inspect(run).value("global_step", -1), 20);
  for (int64_t at : {100, 101, 102, 103}) flip_byte(final_ckpt + "/model.pt", at);

  r = run_gpurun({"export", run, "--to", dir / "s2.pt"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "the newest checkpoint " + final_ckpt +
                                  " (global step 20) does not "
                                  "verify (model.pt: xxh3 mismatch"))
      << r.err;
  EXPECT_TRUE(contains(r.err, previous + " (global step 16): export it with --step 16")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "s2.pt"));
  r = run_gpurun({"export", run, "--to", dir / "s2.pt", "--step", "16"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "ckpt-e0001-s0000016 (global step 16")) << r.out;
  r = run_gpurun({"export", final_ckpt, "--to", dir / "s2.pt"});
  EXPECT_EQ(r.exit_code, 3) << r.err;  // the folder named: it must verify

  // A flip keeps every size: status and report say they did not read the checksums.
  r = run_gpurun({"status", qdir});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "checksums not read")) << r.out;
  r = run_gpurun({"status", run});
  EXPECT_TRUE(contains(r.out, "ckpt-e0002-s0000020 (sizes match; checksums not read)")) << r.out;
  // A truncated file is found by its size.
  std::filesystem::resize_file(final_ckpt + "/trainer.pt", 7);
  r = run_gpurun({"status", qdir});
  EXPECT_TRUE(contains(r.out, "DAMAGED")) << r.out;
  EXPECT_TRUE(contains(r.out, "seed-2: DAMAGED: ckpt-e0002-s0000020 (trainer.pt: size 7")) << r.out;
  r = run_gpurun({"status", qdir, "--json"});
  const nlohmann::json status = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(status.is_object()) << r.out;
  EXPECT_TRUE(contains(status["runs"][0]["summary"].value("checkpoint", ""), "trainer.pt: size 7"))
      << r.out;
  r = run_gpurun({"status", run, "--json"});
  const nlohmann::json one = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(one.is_object()) << r.out;
  EXPECT_EQ(one["checkpoints"].value("ok", true), false) << r.out;
  EXPECT_EQ(one["checkpoints"].value("newest_complete", ""), "ckpt-e0001-s0000016") << r.out;
  r = run_gpurun({"report", qdir, "--out", dir / "q.html"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(slurp(dir / "q.html"), "DAMAGED: ckpt-e0002-s0000020")) << r.err;
  r = run_gpurun({"report", run, "--out", dir / "r.html"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(slurp(dir / "r.html"), "finished, but its final checkpoint is not intact"));

  // The same queue command: seed-2 is trained again from step 16, to the same weights.
  r = run_gpurun(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "seed-2 finished, but its final checkpoint is not intact")) << r.err;
  const std::vector<nlohmann::json> resumes = events(run, "resume");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_EQ(resumes[0].value("global_step", -1), 16);
  EXPECT_EQ(run_record(qdir, "seed-2").value("state", ""), "finished");
  EXPECT_EQ(run_record(qdir, "seed-2").value("attempts", 0), 2);
  EXPECT_TRUE(std::filesystem::is_directory(final_ckpt + ".damaged"));
  EXPECT_EQ(inspect(run).value("model_digest", ""), digest);
  EXPECT_EQ(run_gpurun({"ckpt", "verify", run}).exit_code, 0);
  r = run_gpurun({"export", run, "--to", dir / "s2.pt"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "(global step 20, model_digest " + digest)) << r.out;

  // Once intact, it is skipped.
  r = run_gpurun(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(run_record(qdir, "seed-2").value("attempts", 0), 2);
}

// Issue 31 item 4 through the queue: a run whose config file now gives fewer epochs than its
// checkpoint has done is refused by its child (exit 3), which the queue records and does not
// restart, whatever --max-restarts allows.
TEST(Queue, ARunWhoseConfigNowEndsBeforeItsCheckpointFailsWithExit3AndIsNotRestarted) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(90, 30, 3));  // 3 steps an epoch
  const std::string queue = seeds_queue(dir, config, "1");
  const std::string qdir = dir / "q";
  const Result first =
      run_gpurun({"queue", queue, "--dir", qdir}, {{"GPURUN_FAULT", "sigterm:after_step:4"}});
  EXPECT_EQ(first.exit_code, 75) << first.err;
  ASSERT_EQ(run_record(qdir, "seed-1").value("state", ""), "interrupted");
  write_config(dir, small_config(90, 30, 1));  // the same file, now 3 steps in all
  const Result r = run_gpurun({"queue", queue, "--dir", qdir, "--max-restarts", "2"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const nlohmann::json rec = run_record(qdir, "seed-1");
  EXPECT_EQ(rec.value("state", ""), "failed");
  EXPECT_EQ(rec.value("exit_code", 0), 3);
  EXPECT_EQ(rec.value("restarts", -1), 0);
  EXPECT_EQ(rec.value("attempts", 0), 2);
  EXPECT_TRUE(contains(rec.value("error", ""), "train.epochs 1 gives 3 optimizer steps"))
      << rec.dump();
  EXPECT_EQ(events(qdir + "/runs/seed-1", "resume").size(), 0u);
}

// A queued run that stops at its cost.budget (exit 4) saved and is neither failed nor restarted
// now: another try would stop again at once. The queue exits 4, which a scheduler does not
// requeue; with the budget raised in the queue file, the same command resumes it to the end. The
// queue file's stop_command runs at each end; the runs' own cost.stop_command never does.
TEST(Queue, ARunStoppedAtItsBudgetWaitsForARaisedOneAndTheQueueExits4) {
  TempDir dir;
  // Each run's cost.stop_command is left to the queue, whose own runs when nothing is left.
  const std::string runs_marker = dir / "run-stop", queue_marker = dir / "queue-stop";
  const auto config_with = [&](const std::string& budget) {
    return write_config(dir, small_config(400, 20, 3) + "cost: {price_per_hour: 3600, budget: " +
                                 budget + ", stop_command: 'echo run >> " + runs_marker + "'}\n");
  };
  const std::string queue =
      seeds_queue(dir, config_with("6"), "1, 2",
                  "stop_command: echo queue $GPURUN_EXIT_CODE >> " + queue_marker + "\n");
  const std::string qdir = dir / "q";
  // 150 ms a step: 60 steps are 9 s, and the budget is 6 s of a unit a second, of which a
  // loaded machine's start-up may take 3 s before the first step.
  const Env slow{{"GPURUN_FAULT", "sleep150:after_step:*"}};
  const Result r = run_gpurun({"queue", queue, "--dir", qdir, "--max-restarts", "3"}, slow);
  EXPECT_EQ(r.exit_code, 4) << r.err;
  for (const char* name : {"seed-1", "seed-2"}) {
    const nlohmann::json rec = run_record(qdir, name);
    EXPECT_EQ(rec.value("state", ""), "interrupted") << rec.dump();
    EXPECT_EQ(rec.value("exit_code", 0), 4) << rec.dump();
    EXPECT_EQ(rec.value("attempts", 0), 1) << rec.dump();
    EXPECT_EQ(rec.value("restarts", -1), 0) << rec.dump();
    EXPECT_TRUE(contains(rec.value("error", ""), "cost.budget")) << rec.dump();
    const std::vector<nlohmann::json> done = events(qdir + "/runs/" + name, "done");
    ASSERT_EQ(done.size(), 1u) << name;
    EXPECT_EQ(done[0].value("reason", ""), "budget") << name;
  }
  EXPECT_TRUE(contains(r.err, "raise cost.budget in its config")) << r.err;
  EXPECT_EQ(slurp(queue_marker), "queue 4\n");
  EXPECT_TRUE(contains(slurp(qdir + "/runs/seed-1/stderr.log"), "cost.stop_command is not run"));

  // A training key changed in the queue file is refused; the budget raised there is taken.
  const std::string stop_line =
      "stop_command: echo queue $GPURUN_EXIT_CODE >> " + queue_marker + "\n";
  seeds_queue(dir, config_with("6"), "1, 2", "set: [optim.lr=0.5]\n" + stop_line);
  const Result refused = run_gpurun({"queue", queue, "--dir", qdir});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_TRUE(contains(refused.err, "keeps its definition")) << refused.err;
  seeds_queue(dir, config_with("6"), "1, 2", "set: [cost.budget=1000]\n" + stop_line);
  const Result again = run_gpurun({"queue", queue, "--dir", qdir});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  for (const char* name : {"seed-1", "seed-2"}) {
    EXPECT_EQ(run_record(qdir, name).value("state", ""), "finished") << name;
    EXPECT_EQ(events(qdir + "/runs/" + name, "resume").size(), 1u) << name;
    EXPECT_EQ(inspect(qdir + "/runs/" + name).value("global_step", 0), 60) << name;
  }
  EXPECT_EQ(slurp(queue_marker), "queue 4\nqueue 0\n");
  EXPECT_EQ(slurp(runs_marker), "");
}

}  // namespace
}  // namespace gpurun::test

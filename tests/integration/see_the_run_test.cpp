// Seeing a run (issue 14): TensorBoard's own reader (PyPI's tensorboard, EventAccumulator) on
// the event files of a run that was SIGKILLed twice, stopped once and resumed each time; and
// `gpurun report`'s page opened in headless Chromium (tests/browser/check_page.py), on a
// finished run, a running one and a queue, with the unhappy paths of its input.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

const std::string kToolsPython = GPURUN_TOOLS_PYTHON;

/// {tag: [[step, wall_time, value]]} as TensorBoard's reader sees DIR, or with `server` as
/// `tensorboard --logdir DIR` serves it over HTTP (tests/tools/read_tensorboard.py).
nlohmann::json tensorboard_scalars(const std::string& dir, bool server = false) {
  std::vector<std::string> argv{
      kToolsPython, std::string(GPURUN_SOURCE_DIR) + "/tests/tools/read_tensorboard.py"};
  if (server) argv.push_back("--server");
  argv.push_back(dir);
  const Result r = run_program(argv, 180);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out << r.err;
  return j;
}

/// Opens PAGE in headless Chromium; the result's out lists each canvas and the errors.
Result check_page(const std::string& page, int canvases, const std::string& screenshot = "") {
  std::vector<std::string> argv{"/usr/bin/python3",
                                std::string(GPURUN_SOURCE_DIR) + "/tests/browser/check_page.py",
                                page, "--expect-canvases", std::to_string(canvases)};
  if (!screenshot.empty()) argv.insert(argv.end(), {"--screenshot", screenshot});
  return run_program(argv, 180);
}

/// The data object a report page carries (view/report_data.h).
nlohmann::json page_data(const std::string& page) {
  const std::string html = slurp(page);
  const std::string open = "id=\"gpurun-data\">";
  const size_t begin = html.find(open);
  const size_t end = html.find("</script>", begin);
  EXPECT_NE(begin, std::string::npos);
  if (begin == std::string::npos || end == std::string::npos) return nullptr;
  auto j = nlohmann::json::parse(html.substr(begin + open.size(), end - begin - open.size()),
                                 nullptr, false);
  EXPECT_FALSE(j.is_discarded());
  return j;
}

/// The charts of a report's data that have points, i.e. a canvas on the page.
int drawn_charts(const nlohmann::json& data) {
  int n = 0;
  for (const auto& c : data["charts"]) {
    bool points = false;
    for (const auto& d : c["datasets"]) points = points || !d["points"].empty();
    n += points ? 1 : 0;
  }
  return n;
}

std::vector<std::string> mark_kinds(const nlohmann::json& data) {
  std::vector<std::string> kinds;
  for (const auto& m : data["marks"]) kinds.push_back(m["kind"]);
  return kinds;
}

/// The last value metrics.jsonl holds for each step of `event`'s `field`, and its time.
std::map<int64_t, std::pair<double, double>> last_per_step(const std::string& run_dir,
                                                           const std::string& event,
                                                           const std::string& field) {
  std::map<int64_t, std::pair<double, double>> out;
  for (const auto& e : events(run_dir, event))
    if (e.contains(field) && e[field].is_number())
      out[e["global_step"].get<int64_t>()] = {e[field].get<double>(), e["time"].get<double>()};
  return out;
}

// 960 samples in batches of 20: 48 steps an epoch, 96 in two. A checkpoint every 8 steps; the
// first process kills itself after step 13 (5 steps past its checkpoint at 8), the second
// after step 53 (past the epoch's checkpoint at 48), the third is stopped by a SIGTERM after
// step 70 (it saves there), the fourth finishes.
class KilledAndResumed : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("see-the-run");
    const std::string config = write_config(*dir_, small_config(960, 20, 2));
    run_ = *dir_ / "run";
    const std::vector<std::string> args =
        with_sets({config, "--ckpt", run_, "--resume"},
                  {"checkpoint.every_steps=8", "checkpoint.async=false"});
    // Synchronous saves: the checkpoint before each kill is committed, however loaded the
    // machine; 100 ms a step keeps the run's wall time worth charting.
    const std::string slow = "sleep100:after_step:*";
    const std::pair<std::string, int> processes[] = {{slow + ",sigkill:after_step:13", -1},
                                                     {slow + ",sigkill:after_step:53", -1},
                                                     {slow + ",sigterm:after_step:70", 75},
                                                     {"", 0}};
    for (const auto& [fault, exit_code] : processes) {
      const Result r = run_gpurun(args, fault.empty() ? Env{} : Env{{"GPURUN_FAULT", fault}});
      ASSERT_EQ(r.exit_code, exit_code) << fault << "\n" << r.err;
    }
  }
  static void TearDownTestSuite() { delete dir_; }
  static TempDir* dir_;
  static std::string run_;
};
TempDir* KilledAndResumed::dir_ = nullptr;
std::string KilledAndResumed::run_;

TEST_F(KilledAndResumed, TensorBoardsReaderSeesEachStepOnceWithTheMetricsValues) {
  ASSERT_FALSE(kToolsPython.empty()) << "no tensorboard: run scripts/install-deps.sh";
  const nlohmann::json tb = tensorboard_scalars(run_ + "/tensorboard");
  ASSERT_TRUE(tb.is_object());
  EXPECT_EQ(tb["_files"].size(), 4u) << tb["_files"];  // one file per process
  // The killed processes logged steps 9-13 and 49-53 before dying; the reader keeps those of
  // the process that went on, once each, and no step is missing.
  const auto expected = last_per_step(run_, "step", "loss");
  ASSERT_EQ(expected.size(), 96u);
  const auto& loss = tb["train/loss"];
  ASSERT_EQ(loss.size(), 96u) << loss;
  int64_t previous = 0;
  for (const auto& point : loss) {
    const int64_t step = point[0].get<int64_t>();
    EXPECT_EQ(step, previous + 1) << "steps out of order or repeated: " << loss;
    previous = step;
    ASSERT_TRUE(expected.count(step));
    const auto& [value, time] = expected.at(step);
    EXPECT_EQ(point[2].get<double>(), static_cast<double>(static_cast<float>(value))) << step;
    EXPECT_NEAR(point[1].get<double>(), time, 1e-6) << step;  // the real wall time
  }
  for (const std::string tag : {"train/lr", "train/samples_per_second"})
    EXPECT_EQ(tb[tag].size(), 96u) << tag;
  // Per epoch: the end of each epoch at steps 48 and 96, once.
  const auto accuracy = last_per_step(run_, "epoch", "eval_accuracy");
  ASSERT_EQ(tb["eval/accuracy"].size(), 2u) << tb["eval/accuracy"];
  for (const auto& point : tb["eval/accuracy"]) {
    const int64_t step = point[0].get<int64_t>();
    ASSERT_TRUE(accuracy.count(step)) << step;
    EXPECT_EQ(point[2].get<double>(),
              static_cast<double>(static_cast<float>(accuracy.at(step).first)));
  }
  EXPECT_EQ(tb["eval/loss"].size(), 2u);
  EXPECT_EQ(tb["memory/peak_bytes"].size(), 2u);
  // Each process's plan from its first step (1, 9, 49, 71) and each epoch's capacity line.
  EXPECT_EQ(tb["memory/capacity_bytes"].size(), 6u) << tb["memory/capacity_bytes"];
  // Every checkpoint written, once: none was logged by a process after the step the next
  // one resumed from.
  const auto stalls = last_per_step(run_, "checkpoint", "stall_seconds");
  EXPECT_EQ(tb["checkpoint/stall_seconds"].size(), stalls.size());
  EXPECT_EQ(tb["checkpoint/write_seconds"].size(), stalls.size());
  // No tag holds a step twice or goes back.
  for (auto it = tb.begin(); it != tb.end(); ++it) {
    if (it.key() == "_files") continue;
    for (size_t i = 1; i < it.value().size(); ++i)
      EXPECT_GT(it.value()[i][0].get<int64_t>(), it.value()[i - 1][0].get<int64_t>()) << it.key();
  }
}

// What a user's `tensorboard --logdir RUN_DIR` shows (its default loader, the Rust data
// server): the same steps, once each, with the same values as the reader's.
TEST_F(KilledAndResumed, TheTensorBoardServerShowsTheSameCurves) {
  ASSERT_FALSE(kToolsPython.empty()) << "no tensorboard: run scripts/install-deps.sh";
  const nlohmann::json served = tensorboard_scalars(run_ + "/tensorboard", true);
  const nlohmann::json read = tensorboard_scalars(run_ + "/tensorboard");
  for (const std::string tag :
       {"train/loss", "eval/accuracy", "checkpoint/stall_seconds", "memory/peak_bytes"}) {
    ASSERT_TRUE(served.contains(tag)) << served.dump();
    ASSERT_EQ(served[tag].size(), read[tag].size()) << tag;
    for (size_t i = 0; i < read[tag].size(); ++i) {
      EXPECT_EQ(served[tag][i][0], read[tag][i][0]) << tag;
      EXPECT_EQ(served[tag][i][2].get<double>(), read[tag][i][2].get<double>()) << tag;
    }
  }
}

TEST_F(KilledAndResumed, TheReportMarksTheKillsResumesAndSignalAndRendersInChromium) {
  const Result r = run_gpurun({"report", run_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string page = run_ + "/report.html";
  EXPECT_TRUE(contains(r.out, "file://")) << r.out;
  const nlohmann::json data = page_data(page);
  EXPECT_EQ(mark_kinds(data),
            (std::vector<std::string>{"kill", "resume", "kill", "resume", "signal", "resume"}))
      << data["marks"];
  EXPECT_EQ(drawn_charts(data), 7);  // the data wait beside the throughput
  const Result browser = check_page(page, 7);
  EXPECT_EQ(browser.exit_code, 0) << browser.out << browser.err;
  EXPECT_TRUE(contains(browser.out, "7 canvases, 0 errors: ok")) << browser.out;
  // The lr is 0.05 throughout: its axis spans a twentieth of it each side, not 0.05 +- 1.
  EXPECT_TRUE(contains(browser.out, "canvas chart-lr \"Learning rate\"")) << browser.out;
  EXPECT_TRUE(contains(browser.out, "y=[0.0475, 0.0525]")) << browser.out;
  // The tables: the plan's breakdown and the resolved config the run wrote.
  std::vector<std::string> titles;
  for (const auto& t : data["tables"]) titles.push_back(t["title"]);
  EXPECT_EQ(titles,
            (std::vector<std::string>{"Events", "Plan",
                                      "Peak breakdown (the probes' measured parts; the estimate's)",
                                      "Resolved config"}));
}

// A run that is still training: the report reads it, the TensorBoard file already holds its
// first checkpoint (records are flushed as they happen), and a copy of its metrics with a line
// cut halfway is read up to the last complete line.
TEST(SeeTheRun, ARunningRunIsReportedAndItsTensorBoardFileIsCurrent) {
  ASSERT_FALSE(kToolsPython.empty()) << "no tensorboard: run scripts/install-deps.sh";
  TempDir dir("see-the-run");
  const std::string config = write_config(dir, small_config(960, 20, 2));
  const std::string run = dir / "run";
  // 250 ms a step keeps it alive: the SIGTERM below comes at least 10 s (40 steps) before the
  // first epoch ends, whatever the speed of the machine's BLAS or a loaded test machine.
  const pid_t pid = start_gpurun(with_sets({config, "--ckpt", run}, {"checkpoint.every_steps=8"}),
                                 dir / "log", {{"GPURUN_FAULT", "sleep250:after_step:*"}});
  ASSERT_TRUE(wait_for_event(run, "checkpoint", {}, pid)) << slurp(dir / "log.err");
  // The checkpoint's TensorBoard record is queued right after its metrics line: read again
  // until it is there, rather than after a fixed wait.
  nlohmann::json tb = tensorboard_scalars(run + "/tensorboard");
  for (int i = 0; i < 20 && !tb.contains("checkpoint/stall_seconds"); ++i) {
    sleep_for(0.1);
    tb = tensorboard_scalars(run + "/tensorboard");
  }
  ASSERT_TRUE(tb.contains("checkpoint/stall_seconds")) << tb.dump();
  EXPECT_EQ(tb["checkpoint/stall_seconds"][0][0], 8);
  const Result live = run_gpurun({"report", run, "--out", dir / "live.html"});
  EXPECT_EQ(live.exit_code, 0) << live.err;
  const nlohmann::json data = page_data(dir / "live.html");
  EXPECT_EQ(data["summary"][0][1], "running") << data["summary"];
  kill(pid, SIGTERM);
  const Result stopped = wait_gpurun(pid, dir / "log");
  EXPECT_EQ(stopped.exit_code, 75) << stopped.err;
  EXPECT_TRUE(events(run, "epoch").empty()) << "the SIGTERM came after the first epoch's end";

  const std::string cut = dir / "cut";
  std::filesystem::create_directories(cut);
  const std::string metrics = slurp(run + "/metrics.jsonl");
  std::ofstream(cut + "/metrics.jsonl") << metrics << "{\"event\":\"step\",\"time\":17";
  const Result r = run_gpurun({"report", cut});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json cut_data = page_data(cut + "/report.html");
  ASSERT_FALSE(cut_data["notes"].empty());
  EXPECT_TRUE(contains(cut_data["notes"][0], "read up to line")) << cut_data["notes"];
  // Stopped before its first epoch ended: no accuracy yet, the other charts drawn.
  EXPECT_GE(drawn_charts(cut_data), 5);
  const Result browser = check_page(cut + "/report.html", drawn_charts(cut_data));
  EXPECT_EQ(browser.exit_code, 0) << browser.out << browser.err;
}

// The supervisor's restart (--max-restarts) after a SIGKILL: marked as a restart, and the
// TensorBoard file of the restarted worker continues the curve without repeating a step.
TEST(SeeTheRun, ASupervisedRestartIsMarkedAndContinuesTheCurve) {
  TempDir dir("see-the-run");
  const std::string config = write_config(dir, small_config(960, 20, 1));
  const std::string run = dir / "run";
  const Result r = run_gpurun(with_sets({config, "--ckpt", run, "--max-restarts", "1"},
                                        {"checkpoint.every_steps=8", "checkpoint.async=false"}),
                              {{"GPURUN_FAULT", "sleep100:after_step:*,sigkill:after_step:13"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Result report = run_gpurun({"report", run});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  const nlohmann::json data = page_data(run + "/report.html");
  EXPECT_EQ(mark_kinds(data), (std::vector<std::string>{"kill", "restart"})) << data["marks"];
  EXPECT_TRUE(contains(data["marks"][1]["label"], "restart 1: resumed at step 8")) << data["marks"];
  if (!kToolsPython.empty()) {
    const nlohmann::json tb = tensorboard_scalars(run + "/tensorboard");
    ASSERT_EQ(tb["train/loss"].size(), 48u) << tb["train/loss"];
    for (size_t i = 0; i < 48; ++i) EXPECT_EQ(tb["train/loss"][i][0], i + 1);
  }
}

// A run SIGKILLed and not resumed: its status.json still says running, the report says dead.
TEST(SeeTheRun, AKilledRunIsReportedDeadNotRunning) {
  TempDir dir("see-the-run");
  const std::string config = write_config(dir, small_config(400, 20, 1));
  // A second of training first, so that status.json ("running") is on disk before the kill.
  const Result r = run_gpurun({config, "--ckpt", dir / "run"},
                              {{"GPURUN_FAULT", "sleep100:after_step:*,sigkill:after_step:10"}});
  ASSERT_EQ(r.signal, SIGKILL) << r.err;
  const auto status = nlohmann::json::parse(slurp(dir / "run/status.json"), nullptr, false);
  ASSERT_TRUE(status.is_object()) << slurp(dir / "run/status.json");
  EXPECT_EQ(status.value("state", ""), "running");  // its last word before the SIGKILL
  const Result report = run_gpurun({"report", dir / "run"});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  const nlohmann::json data = page_data(dir / "run/report.html");
  EXPECT_TRUE(contains(data["summary"][0][1], "dead")) << data["summary"];
}

TEST(SeeTheRun, BadInputGetsAClearErrorAndExit2) {
  TempDir dir("see-the-run");
  Result missing = run_gpurun({"report", dir / "nope"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(contains(missing.err, "no such directory")) << missing.err;
  Result not_a_run = run_gpurun({"report", dir.path()});
  EXPECT_EQ(not_a_run.exit_code, 2);
  EXPECT_TRUE(contains(not_a_run.err, "no metrics.jsonl")) << not_a_run.err;
  std::ofstream(dir / "metrics.jsonl").close();
  Result empty = run_gpurun({"report", dir.path()});
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_TRUE(contains(empty.err, "is empty")) << empty.err;
  // --out never replaces what is not a page: one typo from the run's own files.
  const std::string config = write_config(dir, small_config(200, 20, 1));
  Result trained = run_gpurun({config, "--ckpt", dir / "run"});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const std::string metrics = slurp(dir / "run/metrics.jsonl");
  Result over = run_gpurun({"report", dir / "run", "--out", dir / "run/metrics.jsonl"});
  EXPECT_EQ(over.exit_code, 2);
  EXPECT_TRUE(contains(over.err, "is not an HTML page")) << over.err;
  EXPECT_EQ(slurp(dir / "run/metrics.jsonl"), metrics);
  Result into_dir = run_gpurun({"report", dir / "run", "--out", dir.path()});
  EXPECT_EQ(into_dir.exit_code, 2);
  EXPECT_TRUE(contains(into_dir.err, "is a directory")) << into_dir.err;
  Result nowhere = run_gpurun({"report", dir / "run", "--out", dir / "no/such/x.html"});
  EXPECT_EQ(nowhere.exit_code, 2);
  EXPECT_TRUE(contains(nowhere.err, "no directory")) << nowhere.err;
  Result twice = run_gpurun({"report", dir / "run"});
  EXPECT_EQ(twice.exit_code, 0) << twice.err;
  Result again = run_gpurun({"report", dir / "run"});  // its own page it replaces
  EXPECT_EQ(again.exit_code, 0) << again.err;
  Result file = run_gpurun({"report", config});
  EXPECT_EQ(file.exit_code, 2);
  EXPECT_TRUE(contains(file.err, "is not a directory")) << file.err;
  Result usage = run_gpurun({"report"});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_TRUE(contains(usage.err, "usage: gpurun report")) << usage.err;
}

// Issue 31, item 8: a run of one optimizer step drew its step axis with ticks at 0.95, 0.96, ...
// (a twentieth of the step each side); global steps are whole numbers.
TEST(SeeTheRun, ASingleStepAxisHasWholeNumberTicks) {
  TempDir dir("see-the-run");
  const std::string config = write_config(dir, small_config(20, 20, 1));
  const Result trained = run_gpurun({config, "--ckpt", dir / "run"});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  ASSERT_EQ(events(dir / "run", "step").size(), 1u);
  ASSERT_EQ(run_gpurun({"report", dir / "run"}).exit_code, 0);
  const std::string page = dir / "run/report.html";
  const Result browser = check_page(page, drawn_charts(page_data(page)));
  ASSERT_EQ(browser.exit_code, 0) << browser.out << browser.err;
  int step_axes = 0;
  std::istringstream lines(browser.out);
  for (std::string line; std::getline(lines, line);) {
    if (!contains(line, "canvas chart-loss") && !contains(line, "canvas chart-lr")) continue;
    ++step_axes;
    const size_t at = line.find("x_ticks=[");
    ASSERT_NE(at, std::string::npos) << line;
    const std::string ticks = line.substr(at + 9, line.find(']', at) - at - 9);
    EXPECT_FALSE(ticks.empty()) << line;
    EXPECT_EQ(ticks.find('.'), std::string::npos) << "a fractional step: " << line;
    EXPECT_TRUE(contains(", " + ticks + ",", " 1,")) << "step 1 has no tick: " << line;
  }
  EXPECT_EQ(step_axes, 2) << browser.out;
}

// Issue 31, item 8: --out of an existing file read the whole file before refusing it (20 s and
// 3.5 GB of memory for a 3 GB file), and a FIFO blocked for ever. The first bytes decide.
TEST(SeeTheRun, OutIsJudgedByItsFirstBytesNotReadWhole) {
  TempDir dir("see-the-run");
  std::filesystem::create_directories(dir / "run");
  std::ofstream(dir / "run/metrics.jsonl")
      << "{\"event\":\"step\",\"time\":1000,\"epoch\":0,\"global_step\":1,\"loss\":1.5,"
         "\"lr\":0.1,\"samples_per_second\":10}\n";
  const std::string big = dir / "big.bin";
  {
    std::ofstream(big).close();
    std::filesystem::resize_file(big,
                                 int64_t{2} << 30);  // sparse: 2 GiB of zeros that take no disk
  }
  Result r = run_gpurun({"report", dir / "run", "--out", big}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "is not an HTML page")) << r.err;
  EXPECT_LT(r.max_rss_bytes, int64_t{1} << 30) << "the file was read whole";
  EXPECT_EQ(std::filesystem::file_size(big), uintmax_t{2} << 30);
  const std::string fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  r = run_gpurun({"report", dir / "run", "--out", fifo}, {}, 20);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "is not an HTML page")) << r.err;
  // A page is still replaced.
  const std::string page = dir / "page.html";
  std::ofstream(page) << "<!DOCTYPE html>\n<html></html>\n";
  r = run_gpurun({"report", dir / "run", "--out", page});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(std::filesystem::file_size(page), 1000u);
}

// RUN_DIR/tensorboard cannot be made (a file is in its place): one warning, and the run
// trains to its end with its metrics.
TEST(SeeTheRun, AnUnwritableTensorBoardDirectoryWarnsOnceAndTrainingGoesOn) {
  TempDir dir("see-the-run");
  const std::string config = write_config(dir, small_config(400, 20, 1));
  const std::string run = dir / "run";
  std::filesystem::create_directories(run);
  std::ofstream(run + "/tensorboard") << "in the way";
  const Result r = run_gpurun({config, "--ckpt", run});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  size_t warnings = 0;
  for (size_t at = r.err.find("no TensorBoard files"); at != std::string::npos;
       at = r.err.find("no TensorBoard files", at + 1))
    ++warnings;
  EXPECT_EQ(warnings, 1u) << r.err;
  EXPECT_EQ(events(run, "step").size(), 20u);
  EXPECT_EQ(events(run, "done").back()["exit_code"], 0);
}

// DDP with two ranks: rank 0 alone writes the TensorBoard file.
TEST(SeeTheRun, OnlyRankZeroWritesTensorBoardFiles) {
  TempDir dir("see-the-run");
  const std::string config = write_config(dir, small_config(400, 20, 1));
  const std::string run = dir / "run";
  const Result r = run_gpurun({config, "--ckpt", run, "--nproc-per-node", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(run + "/tensorboard")) {
    EXPECT_TRUE(contains(e.path().filename().string(), "tfevents")) << e.path();
    ++files;
  }
  EXPECT_EQ(files, 1u);
  if (!kToolsPython.empty()) {
    const nlohmann::json tb = tensorboard_scalars(run + "/tensorboard");
    EXPECT_EQ(tb["train/loss"].size(), 20u);
  }
}

// A real out-of-memory error in the middle of training: the CPU allocator under --memory-limit
// refuses step 5's allocations once the test's hog (util/faults.h) has taken the room the plan
// left after step 4. The step is done again at half the micro-batch, the global batch kept,
// each step is logged once, and the report marks the fallback where it happened.
TEST(SeeTheRun, AnOutOfMemoryStepIsRetriedAtHalfTheMicroBatchAndMarked) {
  TempDir dir("see-the-run");
  // A CNN: its activations, not the weights' gradients, are what a step adds.
  std::string yaml = small_config(400, 20, 1);
  yaml.replace(yaml.find("{name: mlp, hidden: [64]}"), 25, "{name: cnn}");
  const std::string config = write_config(dir, yaml);
  const std::string run = dir / "run";
  const Result r = run_gpurun({config, "--ckpt", run, "--memory-limit", "256MiB"},
                              {{"GPURUN_FAULT", "hog:after_step:4"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "out of memory at global step 4 with micro-batch 20")) << r.err;
  const auto plans = events(run, "plan");
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0]["micro_batch"], 20);
  EXPECT_EQ(plans[0]["accumulation_steps"], 1);
  EXPECT_EQ(plans[1]["out_of_memory"], true);
  EXPECT_EQ(plans[1]["global_step"], 4);
  EXPECT_EQ(plans[1]["micro_batch"], 10);
  EXPECT_EQ(plans[1]["accumulation_steps"], 2);
  EXPECT_EQ(plans[1]["global_batch"], 20);
  std::vector<int64_t> steps, expected;
  for (const auto& e : events(run, "step")) steps.push_back(e["global_step"]);
  for (int64_t s = 1; s <= 20; ++s) expected.push_back(s);
  EXPECT_EQ(steps, expected);

  const Result report = run_gpurun({"report", run});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  const nlohmann::json data = page_data(run + "/report.html");
  ASSERT_EQ(mark_kinds(data), std::vector<std::string>{"oom"}) << data["marks"];
  EXPECT_EQ(data["marks"][0]["step"], 4);
  EXPECT_EQ(data["marks"][0]["label"],
            "out of memory at step 5: micro-batch 20 -> 10, accumulation 2");
}

// A queue directory: one table row and one line per run, in the browser too.
TEST(SeeTheRun, AQueueDirectoryIsOneLinePerRun) {
  TempDir dir("see-the-run");
  const std::string config = write_config(dir, small_config(400, 20, 2));
  const std::string queue = write_config(dir, "config: " + config + "\nseeds: [1, 2]\n", "q.yaml");
  const Result q = run_gpurun({"queue", queue, "--dir", dir / "q"});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  const Result r = run_gpurun({"report", dir / "q"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json data = page_data(dir / "q/report.html");
  EXPECT_EQ(data["kind"], "queue");
  ASSERT_EQ(data["tables"][0]["rows"].size(), 2u);
  EXPECT_EQ(data["tables"][0]["rows"][0][2], "finished");
  EXPECT_EQ(data["charts"][0]["datasets"].size(), 2u);
  const Result browser = check_page(dir / "q/report.html", 2);
  EXPECT_EQ(browser.exit_code, 0) << browser.out << browser.err;
}

}  // namespace
}  // namespace gpurun::test

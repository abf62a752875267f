// gpurun report's reading and reckoning (view/): a run directory read up to its last complete
// line, the processes of a killed and resumed run reconciled, and a page that stays one page
// whatever the config holds. That the page renders is checked in Chromium
// (tests/integration/see_the_run_test.cpp).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"
#include "gpurun/errors.h"
#include "view/report_data.h"
#include "view/report_page.h"
#include "view/run_history.h"

namespace {

using nlohmann::json;

void write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

std::string error_of(const std::string& dir) {
  try {
    gpurun::read_run_history(dir);
  } catch (const gpurun::ConfigError& e) {
    return e.what();
  }
  return "";
}

const json* chart(const json& data, const std::string& id) {
  for (const json& c : data["charts"])
    if (c["id"] == id) return &c;
  return nullptr;
}

std::vector<double> xs(const json& dataset) {
  std::vector<double> out;
  for (const json& p : dataset["points"]) out.push_back(p[0].get<double>());
  return out;
}

TEST(RunHistory, BadInputIsNamed) {
  gpurun::test::TempDir dir("history");
  EXPECT_NE(error_of(dir.path() + "/missing").find("no such directory"), std::string::npos);
  EXPECT_NE(error_of(dir.path()).find("no metrics.jsonl"), std::string::npos);
  write(std::filesystem::path(dir.path()) / "metrics.jsonl", "");
  EXPECT_NE(error_of(dir.path()).find("is empty"), std::string::npos);
  write(std::filesystem::path(dir.path()) / "metrics.jsonl", "{\"event\": \"pl");
  EXPECT_NE(error_of(dir.path()).find("no complete event"), std::string::npos);
}

TEST(RunHistory, AHalfWrittenLastLineIsLeftOutAndABrokenOneSkipped) {
  gpurun::test::TempDir dir("history");
  write(std::filesystem::path(dir.path()) / "metrics.jsonl",
        "{\"event\":\"plan\",\"time\":1,\"global_step\":0}\n"
        "not json\n"
        "{\"event\":\"step\",\"time\":2,\"global_step\":10,\"loss\":1.5}\n"
        "{\"event\":5}\n"
        "{\"event\":\"step\",\"time\":3,\"glob");
  const gpurun::RunHistory run = gpurun::read_run_history(dir.path());
  EXPECT_EQ(run.events.size(), 2u);
  EXPECT_EQ(run.complete_lines, 4);
  EXPECT_TRUE(run.incomplete_tail);
  ASSERT_EQ(run.unreadable_lines.size(), 2u);
  EXPECT_EQ(run.unreadable_lines[0], 2);
  EXPECT_EQ(run.unreadable_lines[1], 4);  // an "event" that is not a name
  const json data = gpurun::run_report_data(run);
  ASSERT_GE(data["notes"].size(), 2u);
  EXPECT_NE(data["notes"][0].get<std::string>().find("read up to line 4"), std::string::npos);
}

// Process 1 trains to step 30, saves at 20 and is SIGKILLed; process 2 resumes at 20 and
// trains again from 21: its steps replace process 1's after 20 on the step axis, and the
// kill, the resume, a signal and an out-of-memory fallback are marked.
TEST(RunReport, AResumeKeepsTheStepsOfTheProcessThatWentOn) {
  gpurun::RunHistory run;
  run.dir = "/runs/x";
  run.events = {
      {{"event", "plan"},
       {"time", 100.0},
       {"global_step", 0},
       {"micro_batch", 64},
       {"capacity_bytes", 1 << 30},
       {"measured_peak_bytes", 1 << 20}},
      {{"event", "step"}, {"time", 110.0}, {"global_step", 10}, {"loss", 2.0}, {"lr", 0.1}},
      {{"event", "step"}, {"time", 120.0}, {"global_step", 20}, {"loss", 1.5}, {"lr", 0.1}},
      {{"event", "epoch"},
       {"time", 121.0},
       {"global_step", 20},
       {"epoch", 0},
       {"eval_accuracy", 0.7},
       {"eval_loss", 1.1},
       {"peak_bytes", 1 << 20}},
      {{"event", "checkpoint"},
       {"time", 122.0},
       {"global_step", 20},
       {"stall_seconds", 0.01},
       {"write_seconds", 0.3}},
      {{"event", "step"}, {"time", 130.0}, {"global_step", 30}, {"loss", 9.0}, {"lr", 0.1}},
      {{"event", "resume"}, {"time", 200.0}, {"global_step", 20}, {"path", "/runs/x/ckpt-20"}},
      {{"event", "plan"},
       {"time", 201.0},
       {"global_step", 20},
       {"micro_batch", 64},
       {"capacity_bytes", 1 << 30},
       {"restarts", 0},
       {"estimate", {{"parameters", 1000}, {"gradients", 1000}, {"activations", 0}}}},
      {{"event", "step"}, {"time", 210.0}, {"global_step", 30}, {"loss", 1.2}, {"lr", 0.05}},
      {{"event", "plan"},
       {"time", 211.0},
       {"global_step", 30},
       {"micro_batch", 32},
       {"accumulation_steps", 2},
       {"out_of_memory", true},
       {"estimate", {{"parameters", 1000}, {"gradients", 1000}, {"activations", 0}}}},
      {{"event", "signal"}, {"time", 215.0}, {"global_step", 35}, {"signal", 15}},
      {{"event", "done"}, {"time", 216.0}, {"exit_code", 75}},
  };
  const json data = gpurun::run_report_data(run);
  const json* loss = chart(data, "loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(xs((*loss)["datasets"][0]), (std::vector<double>{10, 20, 30}));
  EXPECT_DOUBLE_EQ((*loss)["datasets"][0]["points"][2][1].get<double>(), 1.2);  // not 9.0
  const json* accuracy = chart(data, "accuracy");
  EXPECT_EQ(xs((*accuracy)["datasets"][0]), (std::vector<double>{1}));  // epoch 0 is the first
  // Throughput is on the time axis: both processes' rates stay (none logged here).
  std::vector<std::string> kinds;
  for (const json& m : data["marks"]) kinds.push_back(m["kind"]);
  EXPECT_EQ(kinds, (std::vector<std::string>{"kill", "resume", "oom", "signal"}));
  EXPECT_EQ(data["marks"][0]["step"], 30);
  EXPECT_DOUBLE_EQ(data["marks"][0]["minutes"].get<double>(), 30.0 / 60);  // its last event
  EXPECT_EQ(data["marks"][1]["step"], 20);
  EXPECT_NE(data["marks"][2]["label"].get<std::string>().find("64 -> 32"), std::string::npos);
  EXPECT_NE(data["marks"][3]["label"].get<std::string>().find("SIGTERM"), std::string::npos);
  EXPECT_DOUBLE_EQ(data["marks"][1]["minutes"].get<double>(), 101.0 / 60);
  // The peak breakdown lists the estimate's parts that hold bytes.
  std::vector<std::string> parts;
  for (const json& t : data["tables"])
    if (t["title"].get<std::string>().rfind("Peak breakdown", 0) == 0)
      for (const json& row : t["rows"]) parts.push_back(row[0]);
  EXPECT_NE(std::find(parts.begin(), parts.end(), "- parameters"), parts.end());
  EXPECT_EQ(std::find(parts.begin(), parts.end(), "- activations kept for the backward pass"),
            parts.end());
  // Every table is rows of cells, as the page draws them.
  ASSERT_GE(data["tables"].size(), 3u);  // events, plan, peak breakdown
  for (const json& t : data["tables"]) {
    ASSERT_TRUE(t["rows"].is_array()) << t.dump();
    for (const json& row : t["rows"]) {
      ASSERT_TRUE(row.is_array()) << t.dump();
      EXPECT_EQ(row.size(), t["columns"].size()) << t.dump();
    }
  }
}

// A stop by a cloud's preemption notice is marked with the notice, not the SIGTERM it stands for.
TEST(RunReport, ANoticeStopIsMarkedWithTheNotice) {
  gpurun::RunHistory run;
  run.dir = "/runs/x";
  run.events = {
      {{"event", "step"}, {"time", 110.0}, {"global_step", 10}, {"loss", 2.0}, {"lr", 0.1}},
      {{"event", "signal"},
       {"time", 112.0},
       {"global_step", 12},
       {"signal", 15},
       {"notice", {{"cloud", "aws"}, {"kind", "terminate"}, {"seconds_left", 118.0}}},
       {"safe_seconds", 1.5}},
      {{"event", "done"}, {"time", 113.0}, {"exit_code", 75}},
  };
  const json data = gpurun::run_report_data(run);
  ASSERT_EQ(data["marks"].size(), 1u);
  EXPECT_EQ(data["marks"][0]["kind"], "signal");
  EXPECT_EQ(data["marks"][0]["label"], "aws terminate notice at step 12: saved, then exit 75");
}

// A run that logged every step for long: each line is cut to a few thousand points, and a
// single spike and a single dip among 100000 steps are still drawn.
TEST(RunReport, ALongRunIsThinnedWithoutLosingItsSpikes) {
  gpurun::RunHistory run;
  run.dir = "/runs/long";
  run.events.push_back({{"event", "plan"}, {"time", 0.0}, {"global_step", 0}});
  const int steps = 100000;
  for (int s = 1; s <= steps; ++s) {
    const double loss = s == 61234 ? 50.0 : s == 7777 ? -3.0 : 1.0 + 1.0 / s;
    run.events.push_back({{"event", "step"},
                          {"time", static_cast<double>(s)},
                          {"global_step", s},
                          {"loss", loss},
                          {"lr", 0.1},
                          {"samples_per_second", 100.0}});
  }
  const json data = gpurun::run_report_data(run);
  const json& points = (*chart(data, "loss"))["datasets"][0]["points"];
  EXPECT_LE(points.size(), 4000u);
  EXPECT_GE(points.size(), 2000u);
  double highest = 0, lowest = 1e9, previous_x = 0;
  for (const json& p : points) {
    EXPECT_GT(p[0].get<double>(), previous_x);  // in step order, none twice
    previous_x = p[0].get<double>();
    highest = std::max(highest, p[1].get<double>());
    lowest = std::min(lowest, p[1].get<double>());
  }
  EXPECT_EQ(highest, 50.0);
  EXPECT_EQ(lowest, -3.0);
  bool noted = false;
  for (const json& n : data["notes"])
    noted = noted || n.get<std::string>().find("train loss: 100000 points logged") == 0;
  EXPECT_TRUE(noted) << data["notes"].dump();
  EXPECT_LT(gpurun::report_html(data).size(), 2u << 20);  // Chart.js is ~200 KB of it
}

TEST(RunReport, AQueueStateThatDoesNotParseIsBadInput) {
  gpurun::test::TempDir dir("queue");
  write(std::filesystem::path(dir.path()) / "queue.json", "{\"format_version\": 1, \"runs\": 7");
  try {
    gpurun::queue_report_data(dir.path());
    FAIL() << "a broken queue.json was reported";
  } catch (const gpurun::ConfigError& e) {  // exit 2, as a broken metrics.jsonl
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
}

/// label -> colour index of every dataset of the page's charts.
std::map<std::string, int> colours_of(const json& data) {
  std::map<std::string, int> out;
  for (const json& c : data["charts"])
    for (const json& d : c["datasets"]) {
      EXPECT_TRUE(d.contains("colour")) << d.dump();
      const int colour = d.value("colour", -1);
      const auto [it, fresh] = out.emplace(d["label"].get<std::string>(), colour);
      EXPECT_EQ(it->second, colour) << "two colours for " << it->first;
    }
  return out;
}

// Issue 31, item 8: colours followed the order of the series that had points, so that a live
// snapshot (no evaluation yet) and the finished run's page drew the train loss in two colours.
TEST(RunReport, EachSeriesKeepsItsColourFromALiveSnapshotToTheFinishedPage) {
  gpurun::RunHistory live;
  live.dir = "/runs/x";
  live.events = {
      {{"event", "plan"}, {"time", 1.0}, {"global_step", 0}, {"measured_peak_bytes", 1000}},
      {{"event", "step"},
       {"time", 2.0},
       {"epoch", 0},
       {"global_step", 1},
       {"loss", 2.0},
       {"lr", 0.1},
       {"samples_per_second", 10.0}}};
  gpurun::RunHistory finished = live;
  finished.events.push_back({{"event", "epoch"},
                             {"time", 3.0},
                             {"epoch", 0},
                             {"global_step", 1},
                             {"train_loss", 2.0},
                             {"eval_loss", 1.5},
                             {"eval_accuracy", 0.5},
                             {"seconds", 1.0},
                             {"peak_bytes", 1000}});
  finished.events.push_back({{"event", "checkpoint"},
                             {"time", 3.5},
                             {"global_step", 1},
                             {"epoch", 1},
                             {"bytes", 10},
                             {"stall_seconds", 0.1},
                             {"write_seconds", 0.2}});
  finished.events.push_back({{"event", "done"}, {"time", 4.0}, {"exit_code", 0}});
  const auto before = colours_of(gpurun::run_report_data(live));
  const auto after = colours_of(gpurun::run_report_data(finished));
  EXPECT_EQ(before, after);
  EXPECT_NE(before.at("train loss"), before.at("eval loss"));
  std::set<int> distinct;
  for (const auto& [label, colour] : before) distinct.insert(colour);
  EXPECT_EQ(distinct.size(), before.size()) << "two series share a colour";
}

TEST(RunReport, ThePageIsOneSelfContainedDocumentWhateverTheConfigHolds) {
  gpurun::RunHistory run;
  run.dir = "/runs/<b>x</b>";
  run.events = {{{"event", "plan"}, {"time", 1.0}, {"global_step", 0}}};
  run.config = {{"model", {{"name", "</script><script>alert(1)</script><!--"}}}};
  const std::string page = gpurun::report_html(gpurun::run_report_data(run));
  EXPECT_EQ(page.find("alert(1)</script>"), std::string::npos);
  EXPECT_EQ(page.find("<script>alert(1)"), std::string::npos);
  EXPECT_NE(page.find("\\u003c/script\\u003e\\u003cscript\\u003ealert(1)"), std::string::npos);
  EXPECT_EQ(page.find("<!--"), std::string::npos);
  EXPECT_NE(page.find("Chart.js v3"), std::string::npos);  // inlined, not fetched
  EXPECT_EQ(page.find("<script src"), std::string::npos);
  EXPECT_EQ(page.find("<link"), std::string::npos);
  // Three scripts (the data, Chart.js, the page's), each closed once.
  size_t closes = 0;
  for (size_t at = page.find("</script>"); at != std::string::npos;
       at = page.find("</script>", at + 1))
    ++closes;
  EXPECT_EQ(closes, 3u);
}

}  // namespace

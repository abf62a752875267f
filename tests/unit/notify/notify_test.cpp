// The run's messages (notify/) and its cost ledger (train/cost_ledger.h).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "config/shown.h"
#include "forecast/cards.h"
#include "gpurun/config.h"
#include "gpurun/errors.h"
#include "notify/notice_message.h"
#include "notify/notifier.h"
#include "train/cost_ledger.h"

namespace gpurun {
namespace {

using json = nlohmann::json;
namespace stdfs = std::filesystem;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/gpurun-notify-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { stdfs::remove_all(path); }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(NoticeMessage, CarriesTheRunItsPlaceMetricsCostAndATextLine) {
  const json status = {
      {"epoch", 2},
      {"epochs", 10},
      {"global_step", 1200},
      {"total_steps", 4690},
      {"loss", 0.41},
      {"eval_loss", 0.3012},
      {"eval_accuracy", 0.8911},
      {"cost", {{"seconds", 7200.0}, {"attempts", 2}, {"spent", 4.8}, {"budget", 25.0}}},
      {"last_checkpoint", "/mnt/nas/exp1/ckpt-e0003-s0001200"}};
  const json m = notice_message("finished", "exp1", "box-3", status, {{"reason", "finished"}});
  EXPECT_EQ(m["event"], "finished");
  EXPECT_EQ(m["run"], "exp1");
  EXPECT_EQ(m["host"], "box-3");
  EXPECT_EQ(m["step"], 1200);
  EXPECT_EQ(m["epoch"], 3);  // counted from 1, as a person does
  EXPECT_EQ(m["eval_loss"], 0.3012);
  EXPECT_EQ(m["elapsed_seconds"], 7200.0);
  EXPECT_EQ(m["checkpoint"], "/mnt/nas/exp1/ckpt-e0003-s0001200");
  EXPECT_EQ(m["text"],
            "gpurun exp1 on box-3: finished at step 1200 of 4690 (epoch 3/10); eval loss 0.3012, "
            "accuracy 0.8911; 2.0 h, 4.80 spent of 25.00");
  EXPECT_EQ(m["content"], m["text"]);  // Discord's field
}

TEST(NoticeMessage, AFailureShowsTheFirstLineOfItsErrorOnly) {
  const json m = notice_message("failed", "exp1", "box-3", {{"global_step", 7}},
                                {{"error", "cannot write /mnt/nas: No space left\nsecond line"}});
  EXPECT_EQ(m["error"], "cannot write /mnt/nas: No space left");
  EXPECT_EQ(m["text"],
            "gpurun exp1 on box-3: failed at step 7: cannot write /mnt/nas: No space left");
  const std::string long_error(1000, 'x');
  EXPECT_EQ(first_line(long_error).size(), 300u);
}

TEST(NoticeMessage, EachEventReadsAsWhatHappened) {
  const json status = {{"global_step", 5}};
  EXPECT_EQ(notice_message("started", "r", "h", {{"global_step", 0}}, {})["text"],
            "gpurun r on h: started, step 0");
  EXPECT_EQ(notice_message("started", "r", "h", status, {{"resumed", true}})["text"],
            "gpurun r on h: resumed at step 5");
  EXPECT_EQ(notice_message("preempted", "r", "h", status, {{"cause", "SIGTERM"}})["text"],
            "gpurun r on h: preempted by SIGTERM at step 5; it saves and exits 75: run again with "
            "--resume");
  EXPECT_EQ(notice_message("stalled", "r", "h", status, {{"stalled_seconds", 600.0}})["text"],
            "gpurun r on h: stalled: no progress for 600 s at step 5; its workers were killed");
  EXPECT_EQ(notice_message("budget", "r", "h", status, {})["text"],
            "gpurun r on h: stopped at its budget at step 5; saved; raise cost.budget to resume");
  EXPECT_EQ(
      notice_message(
          "finished", "r", "h", status,
          {{"reason", "early_stop"},
           {"early_stop", {{"metric", "eval_loss"}, {"epochs_without_improvement", 3}}}})["text"],
      "gpurun r on h: finished early: eval_loss did not improve for 3 epochs at step 5");
  // A failed checkpoint says whether training goes on after it.
  const json full = {{"error", "No space left on device"}, {"max_failures", 3}};
  auto failed_save = [&](int failures, bool stops, bool final_save) {
    json details = full;
    details.update({{"failures_in_a_row", failures}, {"stops", stops}, {"final", final_save}});
    return notice_message("checkpoint_failed", "r", "h", status, details)["text"];
  };
  EXPECT_EQ(failed_save(1, false, false),
            "gpurun r on h: a checkpoint failed at step 5: No space left on device; training goes "
            "on (1 of 3 failures in a row)");
  EXPECT_EQ(
      failed_save(3, true, false),
      "gpurun r on h: a checkpoint failed at step 5: No space left on device; 3 failures in a "
      "row is checkpoint.max_failures: the run stops");
  EXPECT_EQ(failed_save(1, true, true),
            "gpurun r on h: a checkpoint failed at step 5: No space left on device; it was the "
            "final checkpoint, and the run fails");
}

TEST(NoticeMessage, CostInWords) {
  EXPECT_EQ(describe_cost({{"seconds", 4000.0}, {"attempts", 1}, {"spent", nullptr}}),
            "67 min over 1 attempt; no price known (cost.price_per_hour)");
  EXPECT_EQ(describe_cost({{"seconds", 9000.0},
                           {"attempts", 3},
                           {"spent", 6.0},
                           {"budget", 25.0},
                           {"price_per_hour", 2.4},
                           {"price_source", "card H100 80GB"}}),
            "6.00 spent of a budget of 25.00, 2.5 h over 3 attempts, at 2.40 an hour (card H100 "
            "80GB)");
}

TEST(Notifier, ShowsOnlyTheWebhooksSchemeAndHost) {
  EXPECT_EQ(url_host("https://hooks.slack.com/services/T000/B000/XXXXSECRET"),
            "https://hooks.slack.com");
  EXPECT_EQ(url_host("http://user:pass@ntfy.sh:8080/topic?x=1"), "http://ntfy.sh:8080");
  EXPECT_EQ(url_host("nonsense"), "(not a URL)");
}

TEST(Notifier, RefusesAUrlThatIsNotHttpWithoutShowingIt) {
  NotifyConfig c;
  c.url = "ftp://example.com/SECRET-TOKEN";
  try {
    Notifier n(c, "/tmp", "r");
    FAIL() << "accepted an ftp:// URL";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("SECRET-TOKEN"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("notify.url"), std::string::npos) << e.what();
  }
  for (const char* bad : {"http://", "https://exa mple.com/x", "https:///path"}) {
    c.url = bad;
    EXPECT_THROW(Notifier(c, "/tmp", "r"), ConfigError) << bad;
  }
  c.url = "$GPURUN_TEST_NO_SUCH_VARIABLE";
  EXPECT_THROW(Notifier(c, "/tmp", "r"), ConfigError);
}

TEST(Notifier, RunsTheCommandWithTheJsonOnStdinOncePerKey) {
  TempDir dir;
  NotifyConfig c;
  c.command = "cat >> " + dir.path + "/got.jsonl";
  c.on = {"started", "finished"};
  {
    Notifier n(c, dir.path, "exp1");
    EXPECT_TRUE(n.wants("finished"));
    EXPECT_FALSE(n.wants("stalled"));
    n.send("stalled", {}, {});  // not in notify.on
    n.send("started", {{"global_step", 0}}, {}, "started:abc");
    n.send("finished", {{"global_step", 9}}, {}, "finished:abc");
    n.flush(30);
  }
  {
    Notifier again(c, dir.path, "exp1");  // a process that resumed the run
    again.send("finished", {{"global_step", 9}}, {}, "finished:abc");
    again.send("started", {{"global_step", 9}}, {{"resumed", true}}, "started:other-run");
  }
  std::istringstream lines(slurp(dir.path + "/got.jsonl"));
  std::vector<std::string> events;
  for (std::string line; std::getline(lines, line);)
    events.push_back(json::parse(line).value("event", ""));
  EXPECT_EQ(events, (std::vector<std::string>{"started", "finished", "started"}));
  EXPECT_NE(slurp(dir.path + "/notify-sent.jsonl").find("finished:abc"), std::string::npos);
}

TEST(Notifier, AFailingCommandIsLoggedAndNotRecordedAsSent) {
  TempDir dir;
  NotifyConfig c;
  c.command = "exit 3";
  {
    Notifier n(c, dir.path, "exp1");
    n.send("finished", {}, {}, "finished:x");
  }
  EXPECT_FALSE(stdfs::exists(dir.path + "/notify-sent.jsonl"));
}

TEST(CostLedger, AddsTheEarlierAttemptsToThisOneAtEachAttemptsPrice) {
  CostLedger ledger(2, 3.0, "cost.price_per_hour", 0);
  ledger.restore(
      {{"attempts",
        {{{"start", 1.0}, {"seconds", 3600.0}, {"ranks", 1}, {"price_per_hour", 2.0}},
         {{"start", 9.0}, {"seconds", 1800.0}, {"ranks", 4}, {"price_per_hour", nullptr}},
         "not an attempt"}}});
  const double now = ledger.seconds();
  EXPECT_GE(now, 5400.0);
  EXPECT_LT(now, 5400.0 + 600);  // this process is younger than ten minutes
  // 1 h x 1 rank x 2 + (unknown price: nothing) + this attempt's seconds x 2 ranks x 3 / h.
  const double mine = now - 5400.0;
  EXPECT_NEAR(*ledger.spent(), 2.0 + mine / 3600 * 6, 1e-3);
  EXPECT_NEAR(*ledger.rate_per_second(), 6.0 / 3600, 1e-12);
  const json saved = ledger.to_json();
  ASSERT_EQ(saved["attempts"].size(), 3u);
  EXPECT_EQ(saved["attempts"][2]["ranks"], 2);
  EXPECT_EQ(ledger.summary()["attempts"], 3);
  EXPECT_TRUE(ledger.summary()["budget"].is_null());
}

TEST(CostLedger, EndedAttemptsRunToTheirDoneEventsAndThoseWithoutACheckpointAreAdded) {
  CostLedger ledger(1, 1.0, "cost.price_per_hour", 0);
  ledger.add_ended({{"start", 150.0}, {"seconds", 3.0}});  // nothing restored yet: ignored
  ledger.restore({{"attempts",
                   {{{"start", 100.0}, {"seconds", 10.0}}, {{"start", 200.0}, {"seconds", 5.0}}}}});
  ledger.add_ended({{"start", 200.0}, {"seconds", 4.0}});  // shorter: ignored
  ledger.add_ended("garbage");
  ledger.add_ended({{"start", 50.0}, {"seconds", 9.0}});  // before the first known: ignored
  EXPECT_EQ(ledger.to_json()["attempts"].size(), 3u);     // the two, and this one
  EXPECT_EQ(ledger.to_json()["attempts"][1]["seconds"], 5.0);
  // Each known attempt runs to its own done event, the checkpoint's record being older.
  ledger.add_ended({{"start", 200.0}, {"seconds", 5.5}});
  ledger.add_ended({{"start", 100.0}, {"seconds", 12.0}});
  EXPECT_EQ(ledger.to_json()["attempts"][1]["seconds"], 5.5);
  EXPECT_EQ(ledger.to_json()["attempts"][0]["seconds"], 12.0);
  // An attempt after the checkpoint's that saved nothing loaded (a second Ctrl-C) is added,
  // with its own ranks and price; one of this process's start or later is not.
  ledger.add_ended({{"start", 300.0}, {"seconds", 20.0}, {"ranks", 2}, {"price_per_hour", 3.0}});
  ledger.add_ended({{"start", 300.0}, {"seconds", 21.0}, {"ranks", 2}});  // itself: extended
  ledger.add_ended(ledger.this_attempt());
  const json attempts = ledger.to_json()["attempts"];
  ASSERT_EQ(attempts.size(), 4u);
  EXPECT_EQ(attempts[2]["start"], 300.0);
  EXPECT_EQ(attempts[2]["seconds"], 21.0);
  EXPECT_EQ(attempts[2]["ranks"], 2);
  EXPECT_EQ(attempts[2]["price_per_hour"], 3.0);
  const json mine = ledger.this_attempt();
  EXPECT_EQ(mine["ranks"], 1);
  EXPECT_EQ(mine["price_per_hour"], 1.0);
}

TEST(CostLedger, TheBudgetLooksAheadAndNeedsAPrice) {
  // One unit a second; this process's own age counts too, so the budget is set from it.
  const nlohmann::json earlier = {{"attempts", {{{"seconds", 90.0}, {"price_per_hour", 3600.0}}}}};
  CostLedger probe(1, 3600.0, "cost.price_per_hour", 0);
  probe.restore(earlier);
  CostLedger priced(1, 3600.0, "cost.price_per_hour", *probe.spent() + 100);
  priced.restore(earlier);
  EXPECT_FALSE(priced.would_pass_budget(0));
  EXPECT_FALSE(priced.would_pass_budget(50));
  EXPECT_TRUE(priced.would_pass_budget(200));
  CostLedger unpriced(1, std::nullopt, "", 100);
  unpriced.restore({{"attempts", {{{"seconds", 1e6}}}}});
  EXPECT_FALSE(unpriced.would_pass_budget(1e6));
  EXPECT_FALSE(unpriced.spent());
}

TEST(CostLedger, TheProcessStartIsThisProcesssOwn) {
  const double start = CostLedger::process_start_unix();
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(start, now);
  EXPECT_GT(start, now - 3600);  // the test binary started within the hour
}

TEST(CostLedger, TheDevicesCardGivesThePriceUnlessOneIsConfigured) {
  const std::vector<Card>& cards = bundled_cards();
  auto h100 = price_for(0, "NVIDIA H100 80GB HBM3", cards);
  ASSERT_TRUE(h100);
  EXPECT_EQ(h100->second, "card H100 80GB");
  auto a100 = price_for(0, "NVIDIA A100-SXM4-80GB", cards);
  ASSERT_TRUE(a100);
  EXPECT_EQ(a100->second, "card A100 80GB");
  EXPECT_FALSE(price_for(0, "cpu", cards));
  EXPECT_FALSE(price_for(0, "NVIDIA GeForce GTX 1080", cards));  // "NVIDIA" alone tells nothing
  auto configured = price_for(1.25, "NVIDIA H100 80GB HBM3", cards);
  EXPECT_EQ(configured->first, 1.25);
  EXPECT_EQ(configured->second, "cost.price_per_hour");
}

TEST(CostConfig, NotifyOnNamesATypoAndTheUrlIsNeverShown) {
  try {
    parse_config("notify: {on: [finished, stalld]}\n", "run.yaml");
    FAIL() << "accepted stalld";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean stalled?"), std::string::npos) << e.what();
  }
  try {
    parse_config("notify: {on: []}\n", "run.yaml");
    FAIL() << "accepted an empty notify.on";
  } catch (const ConfigError& e) {
    // The example is one of its events, not another key's pattern.
    EXPECT_NE(std::string(e.what()).find("a non-empty list of strings like [\"started\"]"),
              std::string::npos)
        << e.what();
  }
  const RunConfig c =
      parse_config("notify: {url: 'https://hooks.slack.com/services/T/B/SECRET'}\n", "run.yaml");
  EXPECT_EQ(config_to_json(c)["notify"]["url"], kHiddenUrl);
  EXPECT_EQ(format_resolved(c).find("SECRET"), std::string::npos);
  const RunConfig named = parse_config("notify: {url: $SLACK_WEBHOOK}\n", "run.yaml");
  EXPECT_EQ(config_to_json(named)["notify"]["url"], "$SLACK_WEBHOOK");
  EXPECT_EQ(shown_argument("notify.url=https://hooks.slack.com/services/SECRET"),
            std::string("notify.url=") + kHiddenUrl);
  EXPECT_EQ(shown_argument("--set=notify.url=$HOOK"), "--set=notify.url=$HOOK");
  EXPECT_EQ(shown_argument("train.epochs=3"), "train.epochs=3");
}

}  // namespace
}  // namespace gpurun

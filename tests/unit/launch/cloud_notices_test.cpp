// The clouds' preemption protocols read from answers as the services write them
// (launch/cloud_notices.h), the DMI strings that name a cloud (launch/cloud_detect.h), and an
// HTTP request in flight ended at once (util/http.h). The requests themselves meet
// a real server in tests/integration/cloud_notice_test.cpp.
#include "launch/cloud_notices.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "launch/cloud_detect.h"
#include "util/clock.h"
#include "util/http.h"

namespace gpurun {
namespace {

// 2026-03-01T12:00:05Z
constexpr double kNow = 1772366405;

TEST(CloudTime, ReadsTheThreeFormatsTheCloudsWrite) {
  EXPECT_EQ(parse_cloud_time("2026-03-01T12:00:05Z"), kNow);
  EXPECT_EQ(parse_cloud_time("2026-03-01T12:00:05.250Z"), kNow);
  EXPECT_EQ(parse_cloud_time("Sun, 01 Mar 2026 12:00:05 GMT"), kNow);
  EXPECT_EQ(parse_cloud_time("01 Mar 2026 12:00:05 GMT"), kNow);
  EXPECT_EQ(utc_text(kNow), "2026-03-01T12:00:05Z");
  EXPECT_FALSE(parse_cloud_time(""));
  EXPECT_FALSE(parse_cloud_time("tomorrow"));
  EXPECT_FALSE(parse_cloud_time("2026-03-01T12:00:05Z trailing"));
}

TEST(AwsNotices, ASpotActionIsANoticeWithItsTime) {
  const Reading r =
      read_aws_spot_action(R"({"action": "terminate", "time": "2026-03-01T12:02:05Z"})", kNow);
  ASSERT_TRUE(r.notice);
  EXPECT_EQ(r.notice->cloud, "aws");
  EXPECT_EQ(r.notice->kind, "terminate");
  EXPECT_EQ(r.notice->deadline, kNow + 120);
  EXPECT_EQ(r.notice->seconds_left_at_notice(), 120);
  EXPECT_EQ(r.notice->to_json()["deadline"], "2026-03-01T12:02:05Z");
  // Without a time: the documented two minutes.
  EXPECT_EQ(read_aws_spot_action(R"({"action": "stop"})", kNow).notice->deadline, kNow + 120);
}

TEST(AwsNotices, GarbageAndStaleActionsAreNoNotice) {
  EXPECT_THROW(read_aws_spot_action("<html>", kNow), BadAnswer);
  EXPECT_THROW(read_aws_spot_action(R"({"action": "explode"})", kNow), BadAnswer);
  EXPECT_THROW(read_aws_spot_action(R"({"action": "stop", "time": "soon"})", kNow), BadAnswer);
  EXPECT_THROW(read_aws_spot_action(R"([1, 2])", kNow), BadAnswer);
  const Reading stale =
      read_aws_spot_action(R"({"action": "stop", "time": "2026-03-01T11:00:00Z"})", kNow);
  EXPECT_FALSE(stale.notice);
  EXPECT_EQ(stale.remarks.size(), 1u);
}

TEST(AwsNotices, AScheduledEventActsWithinTheLeadOnly) {
  const auto events = [](const std::string& code, const std::string& not_before,
                         const std::string& state = "active") {
    return R"([{"Code": ")" + code + R"(", "Description": "x", "EventId": "instance-event-1", )" +
           R"("NotBefore": ")" + not_before + R"(", "State": ")" + state + R"("}])";
  };
  const Reading near =
      read_aws_scheduled(events("system-reboot", "01 Mar 2026 12:10:05 GMT"), kNow);
  ASSERT_TRUE(near.notice);
  EXPECT_EQ(near.notice->kind, "system-reboot");
  EXPECT_EQ(near.notice->event_id, "instance-event-1");
  EXPECT_EQ(near.notice->deadline, kNow + 600);
  const Reading far = read_aws_scheduled(events("instance-stop", "08 Mar 2026 12:00:05 GMT"), kNow);
  EXPECT_FALSE(far.notice);
  EXPECT_EQ(far.remarks.size(), 1u);
  EXPECT_FALSE(
      read_aws_scheduled(events("instance-stop", "01 Mar 2026 12:00:05 GMT", "completed"), kNow)
          .notice);
  EXPECT_FALSE(
      read_aws_scheduled(events("system-maintenance", "01 Mar 2026 12:01:05 GMT"), kNow).notice);
  EXPECT_FALSE(read_aws_scheduled("[]", kNow).notice);
  EXPECT_THROW(read_aws_scheduled(events("meteor", "01 Mar 2026 12:01:05 GMT"), kNow), BadAnswer);
  EXPECT_THROW(read_aws_scheduled(R"({"Code": 1})", kNow), BadAnswer);
}

TEST(GcpNotices, PreemptedAndTerminatingMaintenanceAreNotices) {
  EXPECT_FALSE(read_gcp_preempted("FALSE", kNow).notice);
  const Reading preempted = read_gcp_preempted("TRUE\n", kNow);
  ASSERT_TRUE(preempted.notice);
  EXPECT_EQ(preempted.notice->deadline, kNow + 30);
  EXPECT_THROW(read_gcp_preempted("MAYBE", kNow), BadAnswer);
  EXPECT_FALSE(read_gcp_maintenance("NONE", kNow).notice);
  const Reading migrate = read_gcp_maintenance("MIGRATE_ON_HOST_MAINTENANCE", kNow);
  EXPECT_FALSE(migrate.notice);
  EXPECT_EQ(migrate.remarks.size(), 1u);
  const Reading terminate = read_gcp_maintenance("TERMINATE_ON_HOST_MAINTENANCE", kNow);
  ASSERT_TRUE(terminate.notice);
  EXPECT_EQ(terminate.notice->deadline, kNow + 60);
  EXPECT_THROW(read_gcp_maintenance("{}", kNow), BadAnswer);
}

std::string azure_event(const std::string& type, const std::string& vm,
                        const std::string& not_before, const std::string& id = "E1") {
  return R"({"EventId": ")" + id + R"(", "EventStatus": "Scheduled", "EventType": ")" + type +
         R"(", "ResourceType": "VirtualMachine", "Resources": [")" + vm + R"("], "NotBefore": ")" +
         not_before + R"("})";
}

std::string azure_document(const std::string& events) {
  return R"({"DocumentIncarnation": 3, "Events": [)" + events + "]}";
}

TEST(AzureNotices, OnlyThisMachinesStoppingEventsAct) {
  const std::string soon = "Sun, 01 Mar 2026 12:00:35 GMT";
  const Reading preempt =
      read_azure_events(azure_document(azure_event("Preempt", "vm1", soon)), "vm1", kNow);
  ASSERT_TRUE(preempt.notice);
  EXPECT_EQ(preempt.notice->kind, "Preempt");
  EXPECT_EQ(preempt.notice->event_id, "E1");
  EXPECT_EQ(preempt.notice->deadline, kNow + 30);
  // Another machine's reboot, this one's freeze: remarks, no stop.
  const Reading others = read_azure_events(azure_document(azure_event("Reboot", "vm2", soon) + "," +
                                                          azure_event("Freeze", "vm1", soon, "E2")),
                                           "vm1", kNow);
  EXPECT_FALSE(others.notice);
  EXPECT_EQ(others.remarks.size(), 2u);
  // The name unknown: every event is this machine's.
  EXPECT_TRUE(
      read_azure_events(azure_document(azure_event("Reboot", "vm2", soon)), "", kNow).notice);
  // Started (NotBefore empty): the deadline is now.
  const Reading started =
      read_azure_events(azure_document(azure_event("Redeploy", "vm1", "")), "vm1", kNow);
  ASSERT_TRUE(started.notice);
  EXPECT_EQ(started.notice->deadline, kNow);
  // A hardware migration days ahead waits for the lead.
  EXPECT_FALSE(read_azure_events(
                   azure_document(azure_event("Redeploy", "vm1", "Thu, 05 Mar 2026 12:00:05 GMT")),
                   "vm1", kNow)
                   .notice);
  EXPECT_FALSE(read_azure_events(azure_document(""), "vm1", kNow).notice);
  EXPECT_THROW(read_azure_events("{\"Events\": 5}", "vm1", kNow), BadAnswer);
  EXPECT_THROW(read_azure_events("\x01garbage", "vm1", kNow), BadAnswer);
  EXPECT_THROW(read_azure_events(azure_document(azure_event("Explode", "vm1", soon)), "vm1", kNow),
               BadAnswer);
}

TEST(CloudDetect, TheDmiStringsOfEachCloud) {
  EXPECT_EQ(cloud_of({"Amazon EC2", "p4d.24xlarge", "1.0", ""}), Cloud::kAws);
  EXPECT_EQ(cloud_of({"Xen", "HVM domU", "4.11.amazon", ""}), Cloud::kAws);
  EXPECT_EQ(cloud_of({"Google", "Google Compute Engine", "Google", ""}), Cloud::kGcp);
  EXPECT_EQ(cloud_of({"Microsoft Corporation", "Virtual Machine", "Hyper-V UEFI Release v4.1",
                      kAzureAssetTag}),
            Cloud::kAzure);
  // A Hyper-V guest on a desk says the same two words, without Azure's asset tag.
  EXPECT_EQ(cloud_of({"Microsoft Corporation", "Virtual Machine", "Hyper-V", "None"}),
            Cloud::kNone);
  EXPECT_EQ(cloud_of({"QEMU", "Standard PC (Q35 + ICH9, 2009)", "1.16.2", ""}), Cloud::kNone);
  EXPECT_EQ(cloud_of({}), Cloud::kNone);
}

TEST(CloudDetect, ReadsAFolderOfDmiFiles) {
  test::TempDir dir;
  std::ofstream(dir / "sys_vendor") << "Google\n";
  std::ofstream(dir / "product_name") << "Google Compute Engine\n";
  const DmiIdentity dmi = read_dmi(dir.path());
  EXPECT_EQ(dmi.sys_vendor, "Google");
  EXPECT_EQ(dmi.product_name, "Google Compute Engine");
  EXPECT_EQ(dmi.chassis_asset_tag, "");
  EXPECT_EQ(cloud_of(dmi), Cloud::kGcp);
  EXPECT_EQ(read_dmi(dir / "missing").summary(), "no DMI");
}

// A server that accepts the connection and never answers: abort() from another thread ends the
// request at once, whatever its timeout, so that the end of a run never waits for the watcher.
TEST(HttpClient, AbortEndsARequestInFlightAtOnce) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t length = sizeof address;
  getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  HttpClient http;
  HttpRequest r;
  r.url = "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port)) + "/silent";
  r.total_seconds = 60;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    http.abort();
  });
  const auto start = std::chrono::steady_clock::now();
  const HttpAnswer a = http.send(r);
  const double seconds = seconds_since(start);
  stopper.join();
  close(listener);
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(a.error, "aborted");
  EXPECT_LT(seconds, 10) << "the request outlived abort()";
  EXPECT_EQ(http.send(r).error, "aborted");  // and later ones return at once
}

TEST(HttpClient, NoServerIsAnAnswerWithAnError) {
  HttpClient http;
  HttpRequest r;
  r.url = "http://127.0.0.1:1/nothing";  // port 1: nothing listens, refused at once
  const HttpAnswer a = http.send(r);
  EXPECT_EQ(a.status, 0);
  EXPECT_FALSE(a.error.empty());
}

}  // namespace
}  // namespace gpurun

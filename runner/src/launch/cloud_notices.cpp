#include "launch/cloud_notices.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/clock.h"

namespace gpurun {
namespace {

using json = nlohmann::json;

std::string trimmed(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

/// At most 80 bytes of `text`, for a message about a bad answer.
std::string excerpt(const std::string& text) {
  std::string out = text.substr(0, 80);
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  return "\"" + out + (text.size() > 80 ? "...\"" : "\"");
}

json parse_json(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) throw BadAnswer("not JSON: " + excerpt(body));
  return j;
}

/// `j[key]` as a string: "" when missing or null; BadAnswer for another type.
std::string text_of(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  if (!it->is_string()) throw BadAnswer(std::string(key) + " is not a string: " + it->dump());
  return it->get<std::string>();
}

double time_of(const std::string& text) {
  const std::optional<double> t = parse_cloud_time(text);
  if (!t) throw BadAnswer("a time that does not parse: " + excerpt(text));
  return *t;
}

StopNotice notice(const char* cloud, std::string kind, double deadline, double now) {
  StopNotice n;
  n.cloud = cloud;
  n.kind = std::move(kind);
  n.deadline = deadline;
  n.noticed = now;
  return n;
}

/// A scheduled event of `cloud` starting at `start`: a notice now within the lead, else a
/// remark, keyed by the event and its time so that a rescheduled event is noted again.
void schedule(Reading& reading, StopNotice event, double start, double now,
              const std::string& what) {
  if (start - now <= kScheduledLeadSeconds) {
    if (!reading.notice) reading.notice = std::move(event);
    return;
  }
  reading.remarks.emplace_back(event.cloud + ":" + event.event_id + ":" + utc_text(start),
                               fmt::format("{} at {}: gpurun will stop {:.0f} minutes before it",
                                           what, utc_text(start), kScheduledLeadSeconds / 60));
}

}  // namespace

std::optional<double> parse_cloud_time(const std::string& raw) {
  std::string text = trimmed(raw);
  // ISO 8601's fraction of a second: dropped (a notice's time needs no more than seconds).
  if (const size_t dot = text.find('.');
      dot != std::string::npos && !text.empty() && text.back() == 'Z')
    text = text.substr(0, dot) + "Z";
  for (const char* format :
       {"%Y-%m-%dT%H:%M:%SZ", "%a, %d %b %Y %H:%M:%S GMT", "%d %b %Y %H:%M:%S GMT"}) {
    std::tm tm{};
    const char* end = strptime(text.c_str(), format, &tm);
    if (end && *end == '\0') return static_cast<double>(timegm(&tm));
  }
  return std::nullopt;
}

Reading read_aws_spot_action(const std::string& body, double now) {
  const json j = parse_json(body);
  if (!j.is_object()) throw BadAnswer("not an object: " + excerpt(body));
  const std::string action = text_of(j, "action");
  if (action != "terminate" && action != "stop" && action != "hibernate")
    throw BadAnswer("action " + excerpt(action) + " is none of terminate, stop, hibernate");
  const std::string time = text_of(j, "time");
  const double deadline = time.empty() ? now + kAwsSpotSeconds : time_of(time);
  Reading reading;
  if (now - deadline > kStaleSeconds) {
    reading.remarks.emplace_back("aws:spot:" + time,
                                 "a spot " + action + " of " + utc_text(deadline) +
                                     ", long past: a stale notice, not acted on");
    return reading;
  }
  reading.notice = notice("aws", action, deadline, now);
  return reading;
}

Reading read_aws_scheduled(const std::string& body, double now) {
  const json j = parse_json(body);
  if (!j.is_array()) throw BadAnswer("not an array: " + excerpt(body));
  Reading reading;
  for (const json& e : j) {
    if (!e.is_object()) throw BadAnswer("an event that is not an object: " + e.dump());
    const std::string code = text_of(e, "Code"), state = text_of(e, "State");
    const std::string description = text_of(e, "Description");
    // A completed or canceled event stays listed for a while, so marked.
    if ((!state.empty() && state != "active") || description.rfind("[Completed]", 0) == 0 ||
        description.rfind("[Canceled]", 0) == 0)
      continue;
    StopNotice event = notice("aws", code, time_of(text_of(e, "NotBefore")), now);
    event.event_id = text_of(e, "EventId");
    if (code == "system-maintenance") {
      // Network or power maintenance of the host: the instance keeps running.
      reading.remarks.emplace_back("aws:" + event.event_id,
                                   "scheduled system-maintenance at " + utc_text(event.deadline) +
                                       " leaves the instance running: not acted on");
      continue;
    }
    if (code != "instance-reboot" && code != "system-reboot" && code != "instance-retirement" &&
        code != "instance-stop")
      throw BadAnswer("event code " + excerpt(code) + " is not one of EC2's");
    const double start = event.deadline;
    schedule(reading, std::move(event), start, now, "scheduled " + code);
  }
  return reading;
}

Reading read_gcp_preempted(const std::string& body, double now) {
  const std::string word = trimmed(body);
  Reading reading;
  if (word == "TRUE")
    reading.notice = notice("gcp", "preempted", now + kGcpPreemptedSeconds, now);
  else if (word != "FALSE")
    throw BadAnswer("preempted is " + excerpt(body) + ", not TRUE or FALSE");
  return reading;
}

Reading read_gcp_maintenance(const std::string& body, double now) {
  const std::string word = trimmed(body);
  Reading reading;
  if (word == "TERMINATE_ON_HOST_MAINTENANCE")
    reading.notice = notice("gcp", word, now + kGcpMaintenanceSeconds, now);
  else if (word == "MIGRATE_ON_HOST_MAINTENANCE")
    reading.remarks.emplace_back(
        "gcp:migrate", "a live migration comes (" + word + "): the process lives through it");
  else if (word != "NONE")
    throw BadAnswer("maintenance-event is " + excerpt(body) +
                    ", none of NONE, MIGRATE_ON_HOST_MAINTENANCE, TERMINATE_ON_HOST_MAINTENANCE");
  return reading;
}

Reading read_azure_events(const std::string& body, const std::string& vm_name, double now) {
  const json j = parse_json(body);
  if (!j.is_object() || !j.contains("Events") || !j["Events"].is_array())
    throw BadAnswer("no Events array: " + excerpt(body));
  Reading reading;
  for (const json& e : j["Events"]) {
    if (!e.is_object()) throw BadAnswer("an event that is not an object: " + e.dump());
    const std::string type = text_of(e, "EventType"), id = text_of(e, "EventId");
    if (id.empty()) throw BadAnswer("an event without EventId: " + e.dump());
    std::vector<std::string> resources;
    if (const auto r = e.find("Resources"); r != e.end() && r->is_array())
      for (const json& name : *r)
        if (name.is_string()) resources.push_back(name.get<std::string>());
    if (!vm_name.empty() &&
        std::find(resources.begin(), resources.end(), vm_name) == resources.end()) {
      reading.remarks.emplace_back("azure:other:" + id,
                                   "a " + type + " event for other machines (" +
                                       json(resources).dump() + "), not " + vm_name);
      continue;
    }
    if (type == "Freeze") {
      reading.remarks.emplace_back("azure:freeze:" + id,
                                   "a Freeze event (a pause of seconds): the process lives "
                                   "through it");
      continue;
    }
    if (type != "Preempt" && type != "Terminate" && type != "Reboot" && type != "Redeploy")
      throw BadAnswer("EventType " + excerpt(type) + " is not one of Azure's");
    const std::string not_before = text_of(e, "NotBefore");
    // Empty once the event started: the machine goes now.
    const double start = not_before.empty() ? now : time_of(not_before);
    StopNotice event = notice("azure", type, start, now);
    event.event_id = id;
    schedule(reading, std::move(event), start, now, "a " + type + " event");
  }
  return reading;
}

}  // namespace gpurun

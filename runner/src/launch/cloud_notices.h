// What the clouds' metadata services say before they take a machine back, read into a
// StopNotice (util/stop_notice.h). Pure functions of an answer's body and the time, so that
// each protocol's rules are tested without a server; launch/notice_sources.h sends the
// requests. The protocols, as their documentation gives them:
// - AWS, "Spot Instance interruption notices" and "Scheduled events for your instances" (EC2
//   User Guide): spot/instance-action is 404 until the two-minute notice, then
//   {"action": "terminate"|"stop"|"hibernate", "time": "2026-03-01T12:00:05Z"};
//   events/maintenance/scheduled is a JSON array of {"Code", "Description", "EventId",
//   "NotBefore", "NotAfter", "State"}, codes instance-reboot, system-reboot,
//   system-maintenance, instance-retirement, instance-stop, times as "21 Jan 2019 09:00:43 GMT".
// - GCP, "Detect if a VM was preempted" and "Query metadata server for maintenance event
//   notices" (Compute Engine docs): instance/preempted answers TRUE or FALSE, and turns TRUE
//   when the 30 s preemption notice (ACPI G2 soft off, G3 30 s later) starts;
//   instance/maintenance-event answers NONE, MIGRATE_ON_HOST_MAINTENANCE or
//   TERMINATE_ON_HOST_MAINTENANCE, 60 s before the maintenance.
// - Azure, "Azure Metadata Service: Scheduled Events for Linux VMs": scheduledevents answers
//   {"DocumentIncarnation": N, "Events": [{"EventId", "EventType", "ResourceType",
//   "Resources", "EventStatus", "NotBefore", ...}]}, types Freeze, Reboot, Redeploy, Preempt
//   (at least 30 s ahead), Terminate; NotBefore as RFC 1123 ("Mon, 19 Sep 2016 18:29:47 GMT"),
//   empty once the event started. Events reach every machine of an availability set or scale
//   set's placement group: Resources names the machines an event is for.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "util/stop_notice.h"

namespace gpurun {

/// An event scheduled further ahead than this is noted, and acted on once it is this close.
/// Azure gives 15 minutes before a Reboot or Redeploy; AWS schedules its maintenance days
/// ahead and Azure a migration off failing hardware too, and a stop that far ahead would end
/// every restart of the run until the event came.
inline constexpr double kScheduledLeadSeconds = 15 * 60;

/// An AWS spot action whose time passed longer ago than this is stale (an instance stopped by
/// its notice and started again): noted, never acted on.
inline constexpr double kStaleSeconds = 10 * 60;

/// The time from a notice to the machine's end where the answer gives none: AWS's two-minute
/// spot notice, GCP's 30 s of a preemption and 60 s of a maintenance event.
inline constexpr double kAwsSpotSeconds = 120;
inline constexpr double kGcpPreemptedSeconds = 30;
inline constexpr double kGcpMaintenanceSeconds = 60;

/// An answer that does not follow the protocol (JSON that does not parse or has the wrong
/// shape, a word outside the protocol's set, a time that does not parse).
class BadAnswer : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Unix seconds of a time as the clouds write them: ISO 8601 UTC ("2026-03-01T12:00:05Z",
/// fractions of a second allowed), RFC 1123 ("Mon, 19 Sep 2016 18:29:47 GMT") or AWS's
/// scheduled events' "21 Jan 2019 09:00:43 GMT"; nullopt for anything else.
std::optional<double> parse_cloud_time(const std::string& text);

/// What an answer holds: the notice to act on now, if any, and remarks on what it does not act
/// on (an event far ahead, one for another machine, a live migration), each with a key so that
/// it is logged once.
struct Reading {
  std::optional<StopNotice> notice;
  std::vector<std::pair<std::string, std::string>> remarks;  ///< key, message
};

/// The body of a 200 of AWS's spot/instance-action at unix time `now`. Throws BadAnswer.
Reading read_aws_spot_action(const std::string& body, double now);

/// The body of a 200 of AWS's events/maintenance/scheduled: the first active event of a code
/// that stops the machine (not system-maintenance) within kScheduledLeadSeconds. Throws
/// BadAnswer.
Reading read_aws_scheduled(const std::string& body, double now);

/// The body of a 200 of GCP's instance/preempted. Throws BadAnswer.
Reading read_gcp_preempted(const std::string& body, double now);

/// The body of a 200 of GCP's instance/maintenance-event; a live migration is a remark. Throws
/// BadAnswer.
Reading read_gcp_maintenance(const std::string& body, double now);

/// The body of a 200 of Azure's scheduledevents: the first Preempt, Terminate, Reboot or
/// Redeploy event for `vm_name` (any machine's when "") within kScheduledLeadSeconds, or
/// started; a Freeze (a pause of seconds that the process lives through) is a remark. The
/// notice's event_id is the one to acknowledge. Throws BadAnswer.
Reading read_azure_events(const std::string& body, const std::string& vm_name, double now);

}  // namespace gpurun

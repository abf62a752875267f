// The record of a checkpoint directory's lease, DIR/lease.json, apart from the protocol that
// holds it (checkpoint/lease.h, whose file comment gives the format and the rules): reading and
// writing the record, and judging a holder alive or stale.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "checkpoint/storage/checkpoint_storage.h"

namespace gpurun {

/// What a holder recorded about the lease it replaced (absent for a free or unparsable one).
struct LeaseTakeover {
  std::string token;    ///< the displaced holder's token
  bool forced = false;  ///< taken from a live holder with --force
  std::string reason;   ///< why: "--force", or why the old lease was stale
};

/// The contents of a lease.json.
struct LeaseHolder {
  std::string host;             ///< gethostname() of the holder
  int64_t pid = 0;              ///< the holder's process id (meaningful on `host` only)
  double started = 0;           ///< unix seconds when the holder acquired the lease
  double heartbeat = 0;         ///< unix seconds of the holder's last heartbeat
  std::string token;            ///< random 128-bit hex owner token, unique per acquisition
  std::string pid_scope;        ///< boot id + pid namespace where `pid` lives; may be empty
  int64_t pid_start = 0;        ///< the process's start time (clock ticks since boot); 0: unknown
  double timeout = 0;           ///< the holder's lease_timeout, seconds; 0: not recorded (old file)
  double heartbeat_period = 0;  ///< the holder's seconds between heartbeats; 0: not recorded
  std::optional<LeaseTakeover> took_over;  ///< set when the holder replaced another's lease
};

/// Seconds between two heartbeats for a lease that goes stale after `lease_timeout_seconds`:
/// min(lease_timeout / 4, 10), so that a live holder writes at least 4 heartbeats per timeout.
double heartbeat_period_seconds(double lease_timeout_seconds);

/// Reads DIR/lease.json; nullopt when it is absent or unparsable (not JSON, or `host`, `pid`,
/// `heartbeat` or `token` missing or of the wrong type). Throws IoError on other read errors.
std::optional<LeaseHolder> read_lease(const std::string& dir);
/// read_lease() of the root `storage`.
std::optional<LeaseHolder> read_lease(const CheckpointStorage& storage);
/// The lease in the text of a lease.json; nullopt when unparsable (as read_lease()).
std::optional<LeaseHolder> parse_lease(const std::string& text);

/// True when `h` is stale at `now` (unix seconds) by the rules of the file comment: on this
/// same host when its process is gone; elsewhere when its heartbeat is older than its own
/// `timeout`, or than `fallback_timeout_seconds` when the lease records none.
bool lease_is_stale(const LeaseHolder& h, double fallback_timeout_seconds, double now);

/// True when `h`'s process runs on this same host (see the file comment) and is alive.
bool lease_holder_alive_here(const LeaseHolder& h);

/// "host gpu-7, pid 4242, heartbeat 3.2 s ago, started 60.0 s ago" for messages; ages at `now`.
std::string describe_lease_holder(const LeaseHolder& h, double now);

/// The lease's file name in a checkpoint directory.
inline constexpr const char* kLeaseFileName = "lease.json";

/// DIR/lease.json.
std::string lease_path(const std::string& dir);

/// `h` as the text of a lease.json (format_version 2, with this gpurun's version).
std::string lease_to_json(const LeaseHolder& h);

/// Where a pid means something: the boot (a reboot reuses pids) and the pid namespace (two
/// containers on one machine, possibly with one hostname, number their processes apart), as
/// "<boot id>/pid:[inode]". Empty when /proc is unavailable.
const std::string& pid_scope();

/// The start time of process `pid` in clock ticks since boot (field 22 of /proc/PID/stat),
/// which tells a live holder from another process that got its pid; 0 when unknown.
int64_t process_start_ticks(int64_t pid);

/// The timeout, seconds, by which `h` goes stale: its own, or `fallback` for a lease that
/// records none.
double lease_timeout_of(const LeaseHolder& h, double fallback);

/// True when `h` was written on this host: the same hostname and, when both record one, the
/// same pid_scope().
bool lease_on_this_host(const LeaseHolder& h);

/// Why a stale lease is stale, for the log and the taker's `took_over.reason`.
std::string lease_stale_reason(const LeaseHolder& h, double fallback_timeout, double now);

/// "3.2 s ago", or "1.0 s in the future (clock skew?)" for a negative `age` (seconds).
std::string describe_age(double age);

}  // namespace gpurun

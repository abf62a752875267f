// The checkpoint-directory lease of design.md ("Checkpoint directory" → Lease): DIR/lease.json
// names the one run that may write checkpoints into DIR, so that two machines or two gpurun
// processes never interleave checkpoints of one run.
//
//   {"format_version": 1, "host": "gpu-7", "pid": 4242, "started": 1718000000.25,
//    "heartbeat": 1718000060.5, "token": "9f1c...", "pid_scope": "<boot id>/pid:[4026531836]"}
//
// Times are unix seconds (system clock, fractional). The holder rewrites `heartbeat` every
// heartbeat_period_seconds(lease_timeout) from a background thread. A lease is stale when its
// heartbeat is older than lease_timeout, or when its pid is dead (kill(pid, 0) fails with
// ESRCH) on this same host. "Same host" means the same hostname and, when the lease records
// one, the same `pid_scope` (boot id and pid namespace), so two containers or two machines
// that share a hostname never judge each other's pids.
//
// Every write of lease.json is atomic (a temporary file, fsync'd, renamed over it, then the
// directory fsync'd) and conditional: just before the rename the lease is read again and the
// write is dropped when it changed (a taker's view of the old holder, or a heartbeat's own
// token). Taking a lease over is then last-writer-wins: the taker waits kVerifyDelaySeconds,
// re-reads, and owns the lease only when its random token is still there; a loser goes back
// to waiting. POSIX offers nothing stronger across the hosts of a shared file system (on NFS
// this relies on close-to-open consistency), so the heartbeat thread also checks the token
// before every write and, when another owner's token is there (someone used --force), stops
// writing and raises lost(); the trainer polls lost() and stops rather than interleave
// checkpoints.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace gpurun {

/// The contents of a lease.json.
struct LeaseHolder {
  std::string host;       ///< gethostname() of the holder
  int64_t pid = 0;        ///< the holder's process id (meaningful on `host` only)
  double started = 0;     ///< unix seconds when the holder acquired the lease
  double heartbeat = 0;   ///< unix seconds of the holder's last heartbeat
  std::string token;      ///< random 128-bit hex owner token, unique per acquisition
  std::string pid_scope;  ///< boot id + pid namespace where `pid` lives; may be empty
};

/// Seconds between two heartbeats for a lease that goes stale after `lease_timeout_seconds`:
/// min(lease_timeout / 4, 10), so that a live holder writes at least 4 heartbeats per timeout.
double heartbeat_period_seconds(double lease_timeout_seconds);

/// The lease of one checkpoint directory, held from acquire() until release() or destruction.
/// Thread-safe: heartbeat(), still_ours(), holder(), lost() and release() may be called from
/// any thread while the background heartbeat thread runs.
class Lease {
 public:
  /// Delay between writing our lease and re-reading it to confirm that we won a takeover race.
  static constexpr double kVerifyDelaySeconds = 0.2;

  /// Acquires DIR/lease.json, creating DIR when missing, and starts the heartbeat thread.
  ///
  /// An absent, unparsable or stale lease is taken at once (the previous holder is logged).
  /// A live one is waited for, up to `lease_timeout_seconds`: spdlog::warn names the holder
  /// once, then progress is logged about every 10 s, and the lease is taken as soon as it is
  /// released or goes stale. A holder whose heartbeat does not change for a whole
  /// `lease_timeout_seconds` of our waiting counts as stale too, whatever the clocks of the
  /// two hosts say. With `force` a live lease is taken at once (spdlog::warn names the
  /// previous holder, whose heartbeat thread then sees lost()).
  ///
  /// Throws ConfigError when `lease_timeout_seconds` is not > 0, or when a live holder keeps
  /// the lease through the whole wait (the message names its host, pid and heartbeat age);
  /// IoError when DIR or lease.json cannot be created, read or written.
  static std::unique_ptr<Lease> acquire(const std::string& dir, double lease_timeout_seconds,
                                        bool force);

  /// release().
  ~Lease();

  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  /// Rewrites lease.json with heartbeat = now, unless the lease was lost (another owner's
  /// token is in lease.json; then lost() becomes true and nothing is written) or released.
  /// Recreates lease.json when it was deleted. Throws IoError when lease.json cannot be
  /// read or written. The heartbeat thread calls it every heartbeat_period_seconds().
  void heartbeat();

  /// Re-reads lease.json: false when another owner's token is there (lost() becomes true
  /// too), or after lost() or release(); true when our token is there, or when the file is
  /// absent or unparsable (no one else claims DIR; the next heartbeat rewrites it).
  /// Throws IoError on read errors.
  bool still_ours() const;

  /// True once the lease was found taken by another owner. It never becomes false again:
  /// the run must stop writing checkpoints into DIR.
  bool lost() const;

  /// Our lease as last written (heartbeat = time of the last successful heartbeat).
  LeaseHolder holder() const;

  /// The checkpoint directory.
  const std::string& dir() const { return dir_; }

  /// Stops the heartbeat thread and removes lease.json if it still holds our token.
  /// Idempotent; never throws (a removal failure is logged as a warning).
  void release();

 private:
  Lease(std::string dir, double lease_timeout_seconds, LeaseHolder me);
  void heartbeat_loop();
  // False, and lost_ raised (logged once), when `h` carries another owner's token.
  bool check_owner(const std::optional<LeaseHolder>& h) const;

  const std::string dir_;
  const std::string path_;   // DIR/lease.json
  const std::string token_;  // our owner token
  const double period_;      // seconds between heartbeats

  std::mutex io_mu_;       // serializes heartbeat writes and release's removal (held across I/O)
  mutable std::mutex mu_;  // guards me_, released_, stop_ (never held across I/O)
  std::condition_variable stop_cv_;
  LeaseHolder me_;
  bool released_ = false;
  bool stop_ = false;
  mutable std::atomic<bool> lost_{false};
  std::once_flag join_once_;
  std::thread thread_;
};

/// Reads DIR/lease.json; nullopt when it is absent or unparsable (not JSON, or `host`, `pid`,
/// `heartbeat` or `token` missing or of the wrong type). Throws IoError on other read errors.
std::optional<LeaseHolder> read_lease(const std::string& dir);

/// True when `h` is stale at `now` (unix seconds): its heartbeat is older than
/// `lease_timeout_seconds`, or its pid is dead on this same host (see the file comment).
bool lease_is_stale(const LeaseHolder& h, double lease_timeout_seconds, double now);

/// "host gpu-7, pid 4242, heartbeat 3.2 s ago, started 60.0 s ago" for messages; ages at `now`.
std::string describe_lease_holder(const LeaseHolder& h, double now);

}  // namespace gpurun

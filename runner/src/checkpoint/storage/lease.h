// The checkpoint-directory lease of docs/architecture.md ("Checkpoint directory" → Lease):
// DIR/lease.json names the one run that may write checkpoints into DIR, so that two machines or two
// gpurun processes never interleave checkpoints of one run.
//
//   {"format_version": 2, "host": "gpu-7", "pid": 4242, "pid_start": 123456,
//    "pid_scope": "<boot id>/pid:[4026531836]", "started": 1718000000.25,
//    "heartbeat": 1718000060.5, "timeout": 60, "heartbeat_period": 10, "token": "9f1c...",
//    "took_over": {"token": "77ab...", "forced": true, "reason": "--force"}}
//
// Times are unix seconds (system clock, fractional). The holder rewrites `heartbeat` every
// `heartbeat_period` = heartbeat_period_seconds(timeout) from a background thread.
//
// Staleness is judged by the holder's own terms, never by the reader's settings:
//   - A holder on this same host is stale exactly when its process is gone: its pid is dead,
//     or is now another process (`pid_start`, the process's start time, differs). A live
//     local holder is never stale, however old its heartbeat (a long stall, a stopped
//     process): only --force displaces it.
//   - A holder elsewhere is stale when its heartbeat is older than its own `timeout`, or when
//     that heartbeat did not change for a whole `timeout` of the reader's waiting (whatever
//     the two clocks say). A lease.json of an older gpurun records no `timeout`: then the
//     reader's checkpoint.lease_timeout stands in for it.
// "Same host" means the same hostname and, when the lease records one, the same `pid_scope`
// (boot id and pid namespace), so two containers or two machines that share a hostname never
// judge each other's pids.
//
// Every write of lease.json is atomic (a temporary file, fsync'd, renamed over it, then the
// directory fsync'd) and conditional: just before the rename the lease is read again and the
// write is dropped when it changed (a taker's view of the old holder, or a heartbeat's own
// token). Taking a lease over is then last-writer-wins: the taker waits kVerifyDelaySeconds,
// re-reads, and owns the lease only when its random token is still there; a loser goes back
// to waiting. POSIX offers nothing stronger across the hosts of a shared file system (on NFS
// this relies on close-to-open consistency). A taker records in `took_over` whose token it
// replaced, whether with --force, and why, so that the displaced run can say what happened.
//
// What a run does when it cannot hold the lease (a run never writes checkpoints without it,
// since without it two machines could write one run):
//   - At start, a lease that cannot be written (read-only or full file system, no
//     permission) refuses the run: Checkpointer turns the IoError into a ConfigError, exit 2.
//   - Lost: another owner's token appears in lease.json (someone used --force, or took the
//     lease over after this run's heartbeat went silent on a shared file system). The
//     heartbeat thread stops writing and raises lost(); the trainer stops at its next step
//     without saving (a save now would interleave with the new owner's) and exits 2, naming
//     the new holder, how it took the lease, and the steps that are not saved.
//   - Expired: no heartbeat could be written for a whole lease timeout. Other hosts may now
//     take the lease over by the rules above, so the run no longer holds it: as a leader
//     whose lease cannot be renewed steps down, the heartbeat thread stops and raises
//     expired(); the trainer stops at its next step without saving and exits 1 (the
//     supervisor's restart acquires the lease again once the storage works). Until then a
//     failed heartbeat is logged and retried every period.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "checkpoint/storage/checkpoint_storage.h"
#include "checkpoint/storage/lease_holder.h"

namespace gpurun {

template <class T>
class DetachedCall;

/// The lease of one checkpoint directory, held from acquire() until release() or destruction.
/// Thread-safe: heartbeat(), still_ours(), holder(), lost(), expired(), trouble() and release()
/// may be called from any thread while the background heartbeat thread runs.
class Lease {
 public:
  /// Delay between writing our lease and re-reading it to confirm that we won a takeover race.
  static constexpr double kVerifyDelaySeconds = 0.2;

  /// Acquires DIR/lease.json, creating DIR when missing, and starts the heartbeat thread.
  /// Our lease records `lease_timeout_seconds` and its heartbeat period, the terms by which
  /// other runs judge it.
  ///
  /// An absent, unparsable or stale lease (see the file comment) is taken at once (the
  /// previous holder and the reason are logged). A live one is waited for: spdlog::warn
  /// names the holder once, then progress is logged about every 10 s, and the lease is taken
  /// as soon as it is released or goes stale. The wait lasts `lease_timeout_seconds`, or the
  /// holder's own timeout when that is longer and the holder is on another host (so that one
  /// wait outlives a holder that died there). With `force` a live lease is taken at once
  /// (spdlog::warn names the previous holder, whose heartbeat thread then sees lost()).
  ///
  /// Throws ConfigError when `lease_timeout_seconds` is not a finite number > 0, or when a
  /// live holder keeps the lease through the whole wait (the message names its host, pid and
  /// heartbeat age); IoError when DIR or lease.json cannot be created, read or written.
  static std::unique_ptr<Lease> acquire(const std::string& dir, double lease_timeout_seconds,
                                        bool force);
  /// acquire() of the root `storage` (a folder, or a bucket's prefix, whose conditional writes
  /// make the takeover race-free).
  static std::unique_ptr<Lease> acquire(std::shared_ptr<CheckpointStorage> storage,
                                        double lease_timeout_seconds, bool force);

  /// release().
  ~Lease();

  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  /// Rewrites lease.json with heartbeat = now, unless the lease was lost (another owner's
  /// token is in lease.json; then lost() becomes true and nothing is written), expired or
  /// released. Recreates lease.json when it was deleted. Throws IoError when lease.json
  /// cannot be read or written. The heartbeat thread calls it every heartbeat_period_seconds().
  void heartbeat();

  /// Re-reads lease.json: false when another owner's token is there (lost() becomes true
  /// too), or after lost(), expired() or release(); true when our token is there, or when the
  /// file is absent or unparsable (no one else claims DIR; the next heartbeat rewrites it).
  /// A read that takes longer than kReadWaitSeconds (storage that hangs) is not waited for,
  /// nor, while it lasts, another one started: then !expired(), the heartbeat's word, with a
  /// warning. Throws IoError on read errors.
  bool still_ours() const;

  /// How long still_ours() waits for lease.json to be read.
  static constexpr double kReadWaitSeconds = 0.5;

  /// True once the lease was found taken by another owner. It never becomes false again:
  /// the run must stop writing checkpoints into DIR.
  bool lost() const;

  /// True once no heartbeat could be written for a whole lease timeout (less one heartbeat
  /// period): other hosts may take the lease over now, so the run must stop writing
  /// checkpoints into DIR. Also when the heartbeat hangs in storage that does not answer.
  /// Never false again.
  bool expired() const;

  /// When lost() or expired(): what happened, for the run's final error ("lost the lease of
  /// DIR: a run on host gpu-3, pid 77 took it with --force 1.2 s ago"; "the lease of DIR
  /// expired: no heartbeat could be written for 60 s (last error: ...)"). Empty otherwise.
  std::string trouble() const;

  /// The error the last heartbeat met ("write DIR/lease.json.tmp-...: Not a directory"); empty
  /// when the last one was written, or none has been tried yet.
  std::string heartbeat_error() const;

  /// Our lease as last written (heartbeat = time of the last successful heartbeat).
  LeaseHolder holder() const;

  /// The checkpoint directory.
  const std::string& dir() const { return dir_; }

  /// Stops the heartbeat thread, which removes lease.json if it still holds our token (not
  /// after lost() or expired()). Waits for that at most `wait_seconds` (< 0: as long as it
  /// takes); when storage that does not answer holds the thread longer, leaves it behind,
  /// logs a warning and returns false: lease.json then goes stale by itself, and the thread
  /// still uses this object, which the caller must then never destroy (the process exits
  /// first). Idempotent; never throws (a removal failure is logged as a warning).
  bool release(double wait_seconds = -1);

 private:
  using SteadyTime = std::chrono::steady_clock::time_point;
  Lease(std::shared_ptr<CheckpointStorage> storage, double lease_timeout_seconds, LeaseHolder me);
  void heartbeat_loop();
  void remove_if_ours();  // once: removes lease.json when it holds our token
  // True, with expired() raised and `cause` logged once, when no heartbeat was written for the
  // timeout less one period.
  bool step_down(const std::string& cause) const;
  // False, and lost_ raised (logged once, trouble_ set), when `h` carries another owner's token.
  bool check_owner(const std::optional<LeaseHolder>& h) const;

  const std::shared_ptr<CheckpointStorage> storage_;
  const std::string dir_;
  const std::string path_;   // DIR/lease.json
  const std::string token_;  // our owner token
  const double timeout_;     // seconds without a heartbeat after which others may take it
  const double period_;      // seconds between heartbeats

  std::mutex io_mu_;       // serializes heartbeat writes and release's removal (held across I/O)
  mutable std::mutex mu_;  // guards me_, released_, stop_, trouble_ (never held across I/O)
  std::condition_variable stop_cv_;
  LeaseHolder me_;
  SteadyTime last_beat_;  // when lease.json last got our heartbeat (our steady clock)
  bool released_ = false;
  bool stop_ = false;
  mutable std::string trouble_;
  std::string last_error_;  ///< of the last heartbeat that failed; under mu_
  mutable std::atomic<bool> lost_{false};
  mutable std::atomic<bool> expired_{false};
  bool thread_finished_ = false;  // heartbeat_loop() returned (guarded by mu_)
  // still_ours()'s read of lease.json while it lasts (guarded by mu_)
  mutable std::shared_ptr<DetachedCall<std::optional<LeaseHolder>>> pending_read_;
  mutable std::atomic<bool> warned_unanswered_{false};
  std::once_flag join_once_;
  std::thread thread_;
};

}  // namespace gpurun

// The error a worker leaves for its supervisor, as torchelastic's workers do
// (TORCHELASTIC_ERROR_FILE, torch/distributed/elastic/multiprocessing/errors): when
// GPURUN_ERROR_FILE names a file, a worker that fails writes there, as one JSON object, when
// it failed, its exit code, its message and whether the failure was a reaction to a peer (a
// collective that failed because another rank died or hung). The supervisor reads it once the
// worker is reaped, so that the first failure in time that is not such a reaction is reported,
// whichever rank had it and in whatever order the processes ended (launch/root_cause.h).
// No Torch headers here.
#pragma once

#include <optional>
#include <string>

#include "gpurun/errors.h"

namespace gpurun {

/// A collective across the ranks failed: a peer died, hung or is cut off. Exit 1 (retried): the
/// failure of the peer, reported by its own rank, is the root cause.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

/// The run's checkpoint directory is held by another live run (checkpoint/storage/lease.h):
/// this process never took the run over. Exit 2, as a ConfigError; its failure says nothing of
/// the run that holds the directory, so no `failed` message is sent for it, and the run
/// directory's heartbeat and status, which are that run's, are not this process's.
class LeaseHeld : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// The environment variable that names a worker's error file.
inline constexpr const char* kErrorFileVariable = "GPURUN_ERROR_FILE";

/// What a worker's error file holds.
struct ErrorReport {
  double time = 0;  ///< unix seconds when the worker gave up
  int exit_code = 1;
  std::string message;        ///< the error's message, as logged
  bool peer_failure = false;  ///< a PeerFailure: a reaction to another rank
  bool lease_held = false;    ///< a LeaseHeld: another run holds the checkpoint directory
};

/// Writes `e` (exiting with `exit_code`, logged as `message`) to the file GPURUN_ERROR_FILE
/// names, when it is set; a failure to write is ignored (the exit code still tells).
void leave_error_report(const std::exception& e, int exit_code,
                        const std::string& message) noexcept;

/// The report at `path`; none when the file is missing or not a report.
std::optional<ErrorReport> read_error_report(const std::string& path);

}  // namespace gpurun

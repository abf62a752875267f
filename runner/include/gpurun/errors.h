// gpurun's exception hierarchy and process exit codes (docs/architecture.md, "Exit codes").
//
// Errors are thrown where they are found and caught once, at the command-line
// boundary (runner/cli/main.cpp), which maps them to exit codes with exit_code_for().
#pragma once

#include <stdexcept>
#include <string>

namespace gpurun {

/// Process exit codes; fixed by docs/architecture.md ("Exit codes").
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,   ///< any other failure; the supervisor retries it
  kExitUsage = 2,     ///< usage or config error, or the directory is held by a live run
  kExitNoResume = 3,  ///< cannot resume: no valid checkpoint, config or ABI mismatch
  kExitBudget = 4,    ///< stopped before cost.budget was spent, after saving: raise it to resume
  kExitSignal = 75,   ///< stopped by a signal after saving: run again with --resume
};

/// Base of every error gpurun throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The user's mistake: bad command line, bad run.yaml, directory already used. Exit 2.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A run that must resume cannot: no valid checkpoint, changed config, ABI mismatch. Exit 3.
class ResumeError : public Error {
 public:
  using Error::Error;
};

/// A checkpoint whose files are not what its manifest says, found while it is loaded: a file
/// missing, of another size, unreadable (an I/O error), with another xxh3, or not parseable.
/// A ResumeError (exit 3) when no other checkpoint can be taken instead; a resume that can
/// sets the checkpoint aside and falls back to the previous one.
class DamagedCheckpointError : public ResumeError {
 public:
  using ResumeError::ResumeError;
};

/// A plugin .so that this gpurun cannot use: built for another plugin ABI or LibTorch
/// version, or lacking an entry point (plugin.h). A ResumeError, so exit 3 (docs/architecture.md,
/// "Exit codes": "cannot resume ... ABI mismatch"): rebuilding the plugin, not retrying, fixes it.
class AbiError : public ResumeError {
 public:
  using ResumeError::ResumeError;
};

/// The environment failed: a system call on a path returned an errno. Exit 1 (retried).
class IoError : public Error {
 public:
  /// `what` says what was attempted ("write", "rename", ...); `path` the file; `err` the errno.
  IoError(const std::string& what, const std::string& path, int err);
  int error_number() const noexcept { return errno_; }
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  int errno_;
};

/// A signal asked the run to stop; thrown after the state was saved. Exit 75.
class Stopped : public Error {
 public:
  explicit Stopped(int signal_number);
  /// A stop whose cause is not the signal itself (a cloud's preemption notice, which stops the
  /// run as SIGTERM would): "stopped by CAUSE; run again with --resume".
  Stopped(int signal_number, const std::string& cause);
  int signal_number() const noexcept { return signal_; }

 private:
  int signal_;
};

/// The run stopped, its state saved, because going on would spend more than cost.budget; or a
/// resume was refused because the budget is spent. Exit 4: resume with a larger cost.budget.
class BudgetReached : public Error {
 public:
  using Error::Error;
};

/// Maps an exception caught at the boundary to the exit code docs/architecture.md assigns to it.
int exit_code_for(const std::exception& e) noexcept;

}  // namespace gpurun

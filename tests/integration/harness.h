// Drives the real gpurun binary for integration tests: runs it to completion or starts it in
// the background to be killed, with output captured in files.
#pragma once

#include "common/temp_dir.h"

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpurun::test {

struct Result {
  int exit_code = -1;  ///< exit status, or -1 when killed by a signal
  int signal = 0;      ///< the signal that ended it, 0 when it exited
  std::string out, err;
  double seconds = 0;         ///< wall time from the wait's start to the exit
  int64_t max_rss_bytes = 0;  ///< the largest resident set of the process (and children it reaped)
};

/// A fresh directory under $TMPDIR, removed by the destructor.

using Env = std::map<std::string, std::string>;

/// The Python whose torch this build uses (CMake's GPURUN_PYTHON), for interop checks.
inline const char* const kPython = GPURUN_PYTHON;

/// Starts gpurun with `args`, stdout/stderr to `log_prefix`.out/.err; returns its pid.
pid_t start_gpurun(const std::vector<std::string>& args, const std::string& log_prefix,
                   const Env& env = {});

/// Waits for `pid` (at most `timeout_seconds`, then SIGKILLs it and fails the test).
/// Every gpurun a test waits for is also checked for a resume check that found a resume not
/// bit-exact (train/resume_check.h): any test that kills and resumes asserts exactness this
/// way, unless an InexactResumeExpected is alive.
Result wait_gpurun(pid_t pid, const std::string& log_prefix, double timeout_seconds = 300);

/// While one is alive, wait_gpurun() accepts a resume check that found a difference.
class InexactResumeExpected {
 public:
  InexactResumeExpected();
  ~InexactResumeExpected();
  InexactResumeExpected(const InexactResumeExpected&) = delete;
  InexactResumeExpected& operator=(const InexactResumeExpected&) = delete;
};

/// Runs gpurun to completion.
Result run_gpurun(const std::vector<std::string>& args, const Env& env = {},
                  double timeout_seconds = 300);

/// Starts any program (argv[0] an absolute path), stdout/stderr to `log_prefix`.out/.err, in a
/// process group of its own; wait_gpurun() waits for it like for gpurun.
pid_t start_program(const std::vector<std::string>& argv, const std::string& log_prefix,
                    const Env& env = {});

/// Runs any program (e.g. /usr/bin/python3) to completion.
Result run_program(const std::vector<std::string>& argv, double timeout_seconds = 120);

/// Writes a run.yaml: the given YAML text.
std::string write_config(const TempDir& dir, const std::string& yaml,
                         const std::string& name = "run.yaml");

/// A small, fast Fashion-MNIST config: `train` samples, batch `batch`, `epochs` epochs, an MLP
/// (hidden 64) with SGD+momentum, 1 thread; `extra` YAML lines are appended under their section
/// through --set-style overrides passed by the caller.
std::string small_config(int train, int batch, int epochs);

/// The manifest of the newest complete checkpoint in `ckpt_dir` (gpurun ckpt inspect --json).
nlohmann::json inspect(const std::string& ckpt_dir);

/// Every line of RUN_DIR/metrics.jsonl with "event" == `event`.
std::vector<nlohmann::json> events(const std::string& run_dir, const std::string& event);

/// Reads a whole file ("" when missing).
std::string slurp(const std::string& path);

/// `s` without trailing newlines and spaces (a LATEST file's name).
std::string trimmed(std::string s);

/// Flips the bits `mask` of the byte at `offset` of the file `path` in place (its size kept):
/// damage that only its checksum finds.
void flip_byte(const std::string& path, int64_t offset, unsigned char mask = 0x5a);

/// `args` followed by "--set S" for every S of `sets`.
std::vector<std::string> with_sets(std::vector<std::string> args,
                                   const std::vector<std::string>& sets);

/// True when `text` contains `part`.
bool contains(const std::string& text, const std::string& part);

/// How many times `part` occurs in `text` (overlapping occurrences counted).
size_t count_of(const std::string& text, const std::string& part);

/// Sleeps `seconds`.
void sleep_for(double seconds);

/// The system clock in unix seconds, as metrics.jsonl's `time` fields.
double unix_now();

/// The global step a gpurun process said it resumed from on its stderr `err` ("resuming from
/// PATH: epoch E, global step N, ..."), -1 when it said none.
int64_t resumed_step(const std::string& err);

/// Whether the child `pid` has exited (or is not ours to wait for), leaving its exit status to
/// wait_gpurun(): never reaps it.
bool has_exited(pid_t pid);

/// Waits until `ckpt_dir`/LATEST names a checkpoint other than `before` (a new checkpoint was
/// committed), `pid` exits (0: no process to watch), or `timeout_seconds` pass; true only in the
/// first case. Tests that interrupt a run "at a random moment" wait for this first and then add a
/// short random delay, so that every attempt makes progress whatever the machine's speed.
bool wait_for_new_checkpoint(const std::string& ckpt_dir, pid_t pid, const std::string& before,
                             double timeout_seconds = 120);

/// The global_step of `ckpt`'s newest complete checkpoint, -1 when none: the highest step of a
/// folder under its final name (renamed once complete). Not LATEST's: a kill between a rename
/// and LATEST's replacement leaves LATEST one checkpoint behind, and a resume takes the newer.
int64_t newest_complete_step(const std::string& ckpt);

/// Waits until RUN_DIR/metrics.jsonl holds an `event` line for which `accept` is true (any such
/// line when `accept` is empty), `pid` exits (0: no process to watch), or `timeout_seconds`
/// pass; returns that line, or nothing in the two other cases. Tests that signal or kill a run
/// wait for this (or for wait_for_new_checkpoint), never for a fixed time: a faster BLAS or a
/// GPU must neither find the run already finished nor let the test pass without testing.
std::optional<nlohmann::json> wait_for_event(
    const std::string& run_dir, const std::string& event,
    const std::function<bool(const nlohmann::json&)>& accept, pid_t pid,
    double timeout_seconds = 120);

/// Expects every resume_check event of RUN_DIR/metrics.jsonl that compared steps to say the
/// resume was exact (the steps retrained after each resume logged the killed run's losses bit
/// for bit); returns how many compared steps.
size_t expect_exact_resume_checks(const std::string& run_dir);

/// wait_for_event() for a `step` event at `global_step` or later (log.every_steps decides which
/// steps have one).
std::optional<nlohmann::json> wait_for_step(const std::string& run_dir, int64_t global_step,
                                            pid_t pid, double timeout_seconds = 120);

/// Starts the run `args` (with --resume) again and again, SIGKILLing it after each of its first
/// `kills` new checkpoints in `ckpt` (the n-th kill 50 ms x n after the checkpoint appears; the
/// processes to be killed sleep 20 ms after each step, so that the kill finds them training on
/// any machine), until it exits 0; returns how many times it was killed. Any other end fails
/// the test.
int sigkill_after_checkpoints(const std::vector<std::string>& args, const std::string& ckpt,
                              const std::string& log_prefix, int kills);

/// The pid of the worker with RANK=`rank` among `launcher`'s children; -1 when none.
pid_t worker_pid(pid_t launcher, int rank);

/// Waits until `dir` holds a .tmp-ckpt folder (a checkpoint being written or copied there);
/// false when `pid` exits or `seconds` pass first.
bool wait_for_write_in_flight(const std::string& dir, pid_t pid, double seconds);

/// A tmpfs of `size` mounted at a fresh directory (tests run as root); unmounted by the
/// destructor. ok() is false where mount(2) is not permitted: the test then skips.
class Tmpfs {
 public:
  Tmpfs(const std::string& size, bool read_only);
  ~Tmpfs();
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;
  bool ok() const { return ok_; }
  const std::string& path() const { return dir_.path(); }
  /// Makes the mounted file system read-only under a running gpurun; false when it stays
  /// writable. A remount is refused (EBUSY) while a file is open for writing, so it retries.
  bool remount_read_only();
  /// Makes it writable again; false when that fails.
  bool remount_writable();

 private:
  TempDir dir_;
  bool ok_ = false;
};

}  // namespace gpurun::test

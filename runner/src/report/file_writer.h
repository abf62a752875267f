// The run directory's writes (metrics.jsonl, status.json, the TensorBoard files) from a background
// thread, so that slow or hung storage under the run directory (an NFS mount that stopped
// answering) never stalls training. Appends keep their order (those waiting for one file are
// written together, one write and one fsync); a replaced file keeps only its newest content while
// it waits. When the storage falls more than 10 s behind, one warning says so, and
// one more when it caught up; a write that fails is warned about once per file, and training goes
// on.
#pragma once

#include <memory>
#include <string>

namespace gpurun {

class BackgroundFileWriter {
 public:
  BackgroundFileWriter();
  /// Lets the thread write what is queued and end; call flush() first to wait for it. A thread
  /// stuck in a hung file system is left behind: the process exits without it.
  ~BackgroundFileWriter();
  BackgroundFileWriter(const BackgroundFileWriter&) = delete;
  BackgroundFileWriter& operator=(const BackgroundFileWriter&) = delete;

  /// fs::append_bytes(path, data), in the order of the calls (with append_line's).
  void append_bytes(const std::string& path, const std::string& data);
  /// append_bytes(path, line + '\n').
  void append_line(const std::string& path, const std::string& line);
  /// fs::replace_file(path, data) with the newest data given for `path` by then.
  void replace_file(const std::string& path, const std::string& data);

  /// Waits until everything queued so far is written, at most `seconds`; false on timeout.
  bool flush(double seconds);

  /// Seconds the oldest write still waiting has waited; 0 when none waits.
  double seconds_behind() const;

 private:
  struct Shared;
  static void loop(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
};

}  // namespace gpurun

// A faultfs mount (tests/tools/faultfs) for a test: a FUSE pass-through over a temporary folder
// whose faults the test turns on and off while gpurun runs on it.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

#include "common/temp_dir.h"

namespace gpurun::test {

class FaultFs {
 public:
  /// Mounts faultfs over a new temporary folder, with no fault set. ok() is false (and
  /// why() says why) when faultfs is not built, /dev/fuse is missing, or the mount fails.
  FaultFs();
  /// Unmounts (lazily: a hung operation cannot keep it) and stops faultfs.
  ~FaultFs();
  FaultFs(const FaultFs&) = delete;
  FaultFs& operator=(const FaultFs&) = delete;

  bool ok() const { return pid_ > 0; }
  /// Whether this machine can run it at all (faultfs built, /dev/fuse there): a test skips
  /// when not, and fails when it can but the mount failed.
  bool available() const { return available_; }
  const std::string& why() const { return why_; }
  /// The mount point: what gpurun is given.
  std::string path() const { return mount_.path(); }
  /// The folder under it: the same files, without faults.
  std::string source() const { return source_.path(); }
  /// Replaces the rules (faultfs.cpp's control file format; "" for none), atomically.
  void set(const std::string& rules);
  /// Faults injected so far, by kind (errno name, "delay", "hang", "EROFS").
  std::map<std::string, int> injected() const;
  /// faultfs's log of injected faults ("<kind> <op> <path>" lines).
  std::string log() const;

 private:
  TempDir source_, mount_, control_;
  pid_t pid_ = -1;
  bool available_ = false;
  std::string why_;
};

}  // namespace gpurun::test

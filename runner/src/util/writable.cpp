#include "util/writable.h"

#include <unistd.h>

#include <cerrno>

#include "gpurun/errors.h"
#include "util/fs.h"

namespace gpurun {

void probe_writable(const std::string& dir) {
  const std::string probe = dir + "/.gpurun-write-probe-" + std::to_string(::getpid());
  try {
    fs::make_dirs(dir);
    fs::write_file(probe, "gpurun write probe\n");
    if (::unlink(probe.c_str()) != 0) throw IoError("unlink", probe, errno);
  } catch (const IoError&) {
    (void)::unlink(probe.c_str());  // a full disk may have let it be created, empty
    throw;
  }
}

}  // namespace gpurun

#include "integration/faultfs.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

dev_t device_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_dev : 0;
}

}  // namespace

FaultFs::FaultFs() {
  const std::string binary = GPURUN_FAULTFS;
  if (binary.empty()) {
    why_ = "faultfs is not built (libfuse3-dev missing: scripts/install-deps.sh)";
    return;
  }
  if (::access("/dev/fuse", R_OK | W_OK) != 0) {
    why_ = "/dev/fuse is not available here";
    return;
  }
  available_ = true;
  set("");
  const dev_t before = device_of(mount_.path());
  const std::string control = control_ / "rules", log_file = control_ / "log";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, STDOUT_FILENO);
    ::execl(binary.c_str(), binary.c_str(), source_.path().c_str(), mount_.path().c_str(),
            "--control", control.c_str(), "--log", log_file.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 500; ++i) {
    if (device_of(mount_.path()) != before) {
      pid_ = pid;
      return;
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      why_ = "faultfs could not mount (exit status " + std::to_string(status) + ")";
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  why_ = "faultfs did not mount within 5 s";
}

FaultFs::~FaultFs() {
  if (pid_ <= 0) return;
  set("");  // releases hung operations
  ::umount2(mount_.path().c_str(), MNT_DETACH);
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 300; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

void FaultFs::set(const std::string& rules) {
  const std::string tmp = control_ / "rules.tmp";
  std::ofstream(tmp) << rules << "\n";
  std::rename(tmp.c_str(), (control_ / "rules").c_str());
}

std::string FaultFs::log() const { return slurp(control_ / "log"); }

std::map<std::string, int> FaultFs::injected() const {
  std::map<std::string, int> counts;
  std::istringstream lines(log());
  for (std::string kind, rest; lines >> kind && std::getline(lines, rest);) ++counts[kind];
  return counts;
}

}  // namespace gpurun::test

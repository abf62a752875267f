#include "common/temp_dir.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace gpurun::test {

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl =
      std::filesystem::temp_directory_path().string() + "/gpurun-" + prefix + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!std::getenv("GPURUN_KEEP_TEST_DIRS")) std::filesystem::remove_all(path_, ec);
}

}  // namespace gpurun::test

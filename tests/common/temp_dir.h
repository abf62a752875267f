// The one temporary directory of the tests: made under $TMPDIR (or /tmp) on construction,
// removed with everything in it on destruction unless GPURUN_KEEP_TEST_DIRS is set.
#pragma once

#include <string>

namespace gpurun::test {

class TempDir {
 public:
  /// Creates "<tmp>/gpurun-<prefix>-XXXXXX". Throws std::runtime_error when mkdtemp fails.
  explicit TempDir(const std::string& prefix = "test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  /// path() + "/" + name.
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace gpurun::test

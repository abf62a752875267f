// scan_image_folder(): the listing and the checks made when a run sets up (image_folder.h).
#include <fcntl.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "data/image_codec.h"
#include "data/image_folder.h"
#include "gpurun/errors.h"
#include "util/text.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;

bool hidden(const stdfs::path& p) { return starts_with(p.filename().string(), "."); }

/// The format named by a file's first 8 bytes. Throws IoError when it cannot be read.
ImageFormat sniff_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("open", path, errno);
  uint8_t head[8];
  ssize_t n;
  do n = ::read(fd, head, sizeof head);
  while (n < 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  if (n < 0) throw IoError("read", path, err);
  return sniff_image_format(head, static_cast<size_t>(n));
}

/// The regular files under `dir` (symbolic links followed, as torchvision's os.walk does),
/// hidden names left out, sorted.
std::vector<std::string> files_under(const stdfs::path& dir, const std::string& key) {
  std::vector<std::string> out;
  std::error_code ec;
  stdfs::recursive_directory_iterator it(dir, stdfs::directory_options::follow_directory_symlink,
                                         ec);
  for (; !ec && it != stdfs::recursive_directory_iterator(); it.increment(ec)) {
    if (hidden(it->path())) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec)) out.push_back(it->path().string());
  }
  if (ec) throw ConfigError(key + ": cannot list " + dir.string() + ": " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

ImageFolderScan scan_image_folder(const std::string& root, const std::string& key, bool skip_bad) {
  std::error_code ec;
  if (!stdfs::is_directory(root, ec))
    throw ConfigError(key + ": " + root +
                      (stdfs::exists(root, ec) ? " is not a directory" : " does not exist") +
                      " (image_folder: a folder with one subfolder per class)");
  ImageFolderScan scan;
  int64_t loose_files = 0;
  stdfs::directory_iterator it(root, stdfs::directory_options::follow_directory_symlink, ec);
  for (; !ec && it != stdfs::directory_iterator(); it.increment(ec)) {
    if (hidden(it->path())) continue;
    if (it->is_directory(ec))
      scan.classes.push_back(it->path().filename().string());
    else
      ++loose_files;
  }
  if (ec) throw ConfigError(key + ": cannot list " + root + ": " + ec.message());
  if (scan.classes.empty())
    throw ConfigError(key + ": " + root + " holds no class folders (image_folder reads " + root +
                      "/CLASS/FILE.jpg, one subfolder per class)" +
                      (loose_files ? "; it holds " + std::to_string(loose_files) +
                                         " files directly, outside any class folder"
                                   : ""));
  std::sort(scan.classes.begin(), scan.classes.end());
  std::vector<std::string> empty;
  for (size_t label = 0; label < scan.classes.size(); ++label) {
    const stdfs::path dir = stdfs::path(root) / scan.classes[label];
    int64_t found = 0;
    for (const std::string& path : files_under(dir, key)) {
      const ImageFormat format = sniff_file(path);
      if (format == ImageFormat::kUnknown) {
        if (!skip_bad)
          throw ConfigError(key + ": " + path +
                            " is not a JPEG or PNG file (its first bytes are neither "
                            "signature); remove it, or set data.skip_bad: true to skip such "
                            "files");
        spdlog::warn("{}: skipping {}: not a JPEG or PNG file (data.skip_bad)", key, path);
        scan.skipped.push_back(path);
        continue;
      }
      scan.files.push_back({path, static_cast<int64_t>(label)});
      ++found;
    }
    if (found == 0) empty.push_back(scan.classes[label]);
  }
  if (!empty.empty()) {
    std::string names;
    for (const auto& name : empty) names += (names.empty() ? "" : ", ") + name;
    throw ConfigError(key + ": class folder" + (empty.size() > 1 ? "s " : " ") + names + " of " +
                      root + " hold" + (empty.size() > 1 ? "" : "s") +
                      " no JPEG or PNG file; every class needs at least one");
  }
  return scan;
}

}  // namespace gpurun

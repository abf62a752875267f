#include "checkpoint/storage/checkpoint_storage.h"

#include <filesystem>

#include "checkpoint/storage/object_storage.h"
#include "checkpoint/storage/posix_storage.h"
#include "util/hash.h"
#include "util/text.h"

namespace gpurun {

std::string CheckpointStorage::path(const std::string& name) const {
  const std::string& base = root();
  if (base.empty() || base.back() == '/') return base + name;
  return base + "/" + name;
}

std::string CheckpointStorage::read_all(const std::string& name) const {
  std::string bytes;
  read(name, [&](const char* data, size_t size) { bytes.append(data, size); });
  return bytes;
}

std::pair<int64_t, std::string> CheckpointStorage::checksum(const std::string& name) const {
  Xxh3 hash;
  int64_t bytes = 0;
  read(name, [&](const char* data, size_t size) {
    hash.update(data, size);
    bytes += static_cast<int64_t>(size);
  });
  return {bytes, hash.hex()};
}

bool is_object_root(const std::string& root) { return starts_with(root, "s3://"); }

std::shared_ptr<CheckpointStorage> open_storage(const std::string& root) {
  if (is_object_root(root)) return std::make_shared<ObjectStorage>(root);
  return std::make_shared<PosixStorage>(root);
}

std::pair<std::string, std::string> split_folder_path(const std::string& path) {
  if (is_object_root(path)) {
    std::string p = path;
    while (p.size() > 5 && p.back() == '/') p.pop_back();
    const size_t slash = p.rfind('/');
    return {p.substr(0, slash), p.substr(slash + 1)};
  }
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::string parent = p.parent_path().string();
  return {parent.empty() ? "." : parent, p.filename().string()};
}

}  // namespace gpurun

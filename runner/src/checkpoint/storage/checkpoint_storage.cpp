#include "checkpoint/storage/checkpoint_storage.h"

#include <filesystem>
#include <regex>

#include "gpurun/errors.h"

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
  // "S3://b/x", "gs://b/x", "s3:/b/x": a URL gpurun does not read must not become a local
  // folder named "S3:" that a run trains into without a word.
  static const std::regex scheme("^[A-Za-z][A-Za-z0-9+.-]*:/.*");
  if (std::regex_match(root, scheme))
    throw ConfigError(root +
                      " is a URL gpurun does not read: checkpoints go to a folder or to "
                      "s3://BUCKET/PREFIX (any S3 API: AWS, R2, B2, GCS's interoperability "
                      "endpoint, Ceph, MinIO, through AWS_ENDPOINT_URL)");
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

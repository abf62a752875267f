#include "checkpoint/format/folder.h"

#include <filesystem>
#include <set>
#include <stdexcept>

#include "util/hash.h"

namespace gpurun::checkpoint_folder {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

std::string join(const std::string& dir, const std::string& name) {
  return (stdfs::path(dir) / name).string();
}

std::string name_of(const std::string& path) {
  return stdfs::path(path).lexically_normal().filename().string();
}

bool is_plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::string parse_entry(const std::string& name, const json& entry, FileEntry& out) {
  if (!is_plain_name(name) || name == kManifest)
    return "manifest.json: bad file name '" + name + "'";
  const auto bytes = entry.find("bytes");
  const auto xxh3 = entry.find("xxh3");
  if (!entry.is_object() || bytes == entry.end() || !bytes->is_number_integer() ||
      xxh3 == entry.end() || !xxh3->is_string()) {
    return "manifest.json: bad entry for " + name;
  }
  out = {bytes->get<int64_t>(), xxh3->get<std::string>()};
  return "";
}

FileSources file_sources(const CheckpointSnapshot& snapshot, const json& taken) {
  FileSources sources;
  for (const auto& [name, bytes] : snapshot.files)
    sources.emplace_back(
        name, [&bytes = bytes](const ByteSink& out) { out(bytes.data(), bytes.size()); });
  for (const auto& [name, source] : snapshot.streamed) sources.emplace_back(name, source);
  std::set<std::string> seen;
  for (const auto& [name, source] : sources) {
    if (!is_plain_name(name) || name == kManifest || taken.contains(name) ||
        !seen.insert(name).second) {
      throw std::invalid_argument("bad or duplicate checkpoint file name '" + name + "'");
    }
  }
  return sources;
}

json hash_sources(const FileSources& sources) {
  json files = json::object();
  for (const auto& [name, source] : sources) {
    Xxh3 hash;
    int64_t bytes = 0;
    source([&](const char* data, size_t size) {
      hash.update(data, size);
      bytes += static_cast<int64_t>(size);
    });
    files[name] = {{"bytes", bytes}, {"xxh3", hash.hex()}};
  }
  return files;
}

}  // namespace gpurun::checkpoint_folder

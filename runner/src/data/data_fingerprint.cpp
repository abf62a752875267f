#include "data/data_fingerprint.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "data/builtin_datasets.h"
#include "util/hash.h"
#include "util/units.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

double mtime_of(const stdfs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return 0;
  return static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
}

DataFingerprint::Source source_of(const std::string& key, const std::string& path) {
  DataFingerprint::Source s;
  s.key = key;
  s.path = path;
  std::error_code ec;
  std::vector<std::pair<std::string, int64_t>> files;
  const stdfs::path root(path);
  if (stdfs::is_directory(root, ec)) {
    for (auto it = stdfs::recursive_directory_iterator(
             root, stdfs::directory_options::skip_permission_denied, ec);
         !ec && it != stdfs::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      files.emplace_back(stdfs::relative(it->path(), root, ec).string(),
                         static_cast<int64_t>(it->file_size(ec)));
      s.newest_mtime = std::max(s.newest_mtime, mtime_of(it->path()));
    }
  } else if (stdfs::is_regular_file(root, ec)) {
    files.emplace_back(root.filename().string(), static_cast<int64_t>(stdfs::file_size(root, ec)));
    s.newest_mtime = mtime_of(root);
  }
  std::sort(files.begin(), files.end());
  Xxh3 listing;
  for (const auto& [name, size] : files) {
    listing.update(name.data(), name.size() + 1);  // with its '\0'
    const std::string bytes = std::to_string(size);
    listing.update(bytes.data(), bytes.size() + 1);
    s.bytes += size;
  }
  s.files = static_cast<int64_t>(files.size());
  s.listing_xxh3 = listing.hex();
  if (s.files <= DataFingerprint::kListedFiles) s.listed = std::move(files);
  return s;
}

/// "a.png, b.png and 3 more" of at most 5 names.
std::string some_names(const std::vector<std::string>& names) {
  std::string out;
  const size_t shown = std::min<size_t>(names.size(), 5);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += " and " + std::to_string(names.size() - shown) + " more";
  return out;
}

/// What differs between two listings of one source, by file, in words.
std::string listing_change(const DataFingerprint::Source& was, const DataFingerprint::Source& now) {
  std::string what = was.key + " " + now.path + ": ";
  if (!was.listed.empty() || was.files == 0) {
    if (!now.listed.empty() || now.files == 0) {
      const std::map<std::string, int64_t> before(was.listed.begin(), was.listed.end());
      const std::map<std::string, int64_t> after(now.listed.begin(), now.listed.end());
      std::vector<std::string> added, removed, resized;
      for (const auto& [name, size] : after) {
        const auto it = before.find(name);
        if (it == before.end())
          added.push_back(name);
        else if (it->second != size)
          resized.push_back(name + " " + std::to_string(size) + " bytes, was " +
                            std::to_string(it->second));
      }
      for (const auto& [name, size] : before)
        if (!after.count(name)) removed.push_back(name);
      std::vector<std::string> parts;
      if (!added.empty())
        parts.push_back(std::to_string(added.size()) + " added: " + some_names(added));
      if (!removed.empty())
        parts.push_back(std::to_string(removed.size()) + " removed: " + some_names(removed));
      if (!resized.empty()) parts.push_back("changed size: " + some_names(resized));
      std::string joined;
      for (size_t i = 0; i < parts.size(); ++i) joined += (i ? "; " : "") + parts[i];
      if (!joined.empty()) return what + joined;
    }
  }
  if (now.files == was.files && now.bytes == was.bytes)
    return what + "as many files (" + std::to_string(now.files) + ") of as many bytes (" +
           std::to_string(now.bytes) + ") as before, under other names or of other sizes";
  return what + std::to_string(now.files) + " files of " + std::to_string(now.bytes) + " bytes (" +
         format_bytes(now.bytes) + "), was " + std::to_string(was.files) + " files of " +
         std::to_string(was.bytes) + " bytes (" + format_bytes(was.bytes) + ")";
}

}  // namespace

json DataFingerprint::to_json() const {
  json out = {{"train_samples", train_samples}, {"eval_samples", eval_samples}};
  out["sources"] = json::array();
  for (const Source& s : sources) {
    json j = {{"key", s.key},
              {"path", s.path},
              {"files", s.files},
              {"bytes", s.bytes},
              {"listing_xxh3", s.listing_xxh3},
              {"newest_mtime", s.newest_mtime}};
    if (!s.listed.empty()) j["listed"] = s.listed;
    out["sources"].push_back(j);
  }
  return out;
}

DataFingerprint DataFingerprint::from_json(const json& j) {
  DataFingerprint f;
  f.train_samples = j.at("train_samples").get<int64_t>();
  f.eval_samples = j.at("eval_samples").get<int64_t>();
  for (const json& s : j.at("sources")) {
    Source source;
    source.key = s.at("key").get<std::string>();
    source.path = s.at("path").get<std::string>();
    source.files = s.at("files").get<int64_t>();
    source.bytes = s.at("bytes").get<int64_t>();
    source.listing_xxh3 = s.at("listing_xxh3").get<std::string>();
    source.newest_mtime = s.at("newest_mtime").get<double>();
    if (s.contains("listed"))
      source.listed = s["listed"].get<std::vector<std::pair<std::string, int64_t>>>();
    f.sources.push_back(std::move(source));
  }
  return f;
}

DataFingerprint fingerprint_data(const DataConfig& data, int64_t train_samples,
                                 int64_t eval_samples) {
  DataFingerprint f;
  f.train_samples = train_samples;
  f.eval_samples = eval_samples;
  if (data.name == "synthetic") return f;
  if (!data.path.empty()) f.sources.push_back(source_of("data.path", data.path));
  std::string eval = data.eval_path, eval_key = "data.eval_path";
  if (data.name == "tokens" && eval.empty()) {
    eval = tokens_eval_file(data);
    eval_key = "data.eval_path (val.bin beside data.path)";
  }
  if (!eval.empty()) f.sources.push_back(source_of(eval_key, eval));
  if (!data.mask_path.empty()) f.sources.push_back(source_of("data.mask_path", data.mask_path));
  if (!data.eval_mask_path.empty())
    f.sources.push_back(source_of("data.eval_mask_path", data.eval_mask_path));
  return f;
}

DataChange compare_data(const DataFingerprint& saved, const DataFingerprint& now) {
  DataChange c;
  if (saved.train_samples != now.train_samples)
    c.changes.push_back("training samples: " + std::to_string(now.train_samples) + ", was " +
                        std::to_string(saved.train_samples));
  if (saved.eval_samples != now.eval_samples)
    c.changes.push_back("evaluation samples: " + std::to_string(now.eval_samples) + ", was " +
                        std::to_string(saved.eval_samples));
  for (const DataFingerprint::Source& s : now.sources) {
    const auto was = std::find_if(saved.sources.begin(), saved.sources.end(),
                                  [&](const DataFingerprint::Source& o) { return o.key == s.key; });
    if (was == saved.sources.end()) {
      c.changes.push_back(s.key + " " + s.path + ": not read by the checkpoint's run");
      continue;
    }
    if (was->files != s.files || was->bytes != s.bytes || was->listing_xxh3 != s.listing_xxh3)
      c.changes.push_back(listing_change(*was, s));
    else if (s.newest_mtime > was->newest_mtime)
      c.touched.push_back(s.key + " " + s.path);
  }
  for (const DataFingerprint::Source& s : saved.sources)
    if (std::none_of(now.sources.begin(), now.sources.end(),
                     [&](const DataFingerprint::Source& o) { return o.key == s.key; }))
      c.changes.push_back(s.key + " " + s.path + ": read by the checkpoint's run, not now");
  return c;
}

}  // namespace gpurun

#include "data/data_stage.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "data/builtin_datasets.h"
#include "gpurun/errors.h"
#include "s3/s3_client.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/units.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kRecord = ".gpurun-stage.json";

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct SourceFile {
  std::string relative;  ///< path under the staged root
  std::string path;      ///< the source file, or its key in the bucket
  int64_t bytes = 0;
  int64_t mtime_ns = 0;
  std::string etag;  ///< an object's version (its mtime is not in a listing); "" for a file
};

// The objects of an s3:// source, sorted by key: the one object it names, or every object
// under it as a folder.
std::vector<SourceFile> list_objects(S3Client& client, const S3Url& url) {
  std::vector<SourceFile> files;
  if (const std::optional<S3Object> one = client.head(url.prefix)) {
    files.push_back(
        {url.prefix.substr(url.prefix.rfind('/') + 1), one->key, one->size, 0, one->etag});
    return files;
  }
  const std::string base = url.prefix.empty() ? "" : url.prefix + "/";
  for (const S3Object& object : client.list(base).objects) {
    if (object.key.back() == '/') continue;  // a "folder" marker some tools write
    files.push_back({object.key.substr(base.size()), object.key, object.size, 0, object.etag});
  }
  return files;
}

SourceFile source_file(const stdfs::path& path, std::string relative) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw IoError("stat", path.string(), errno);
  return {std::move(relative), path.string(), static_cast<int64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, ""};
}

// The regular files of `source` (itself when it is a file), sorted by relative path.
std::vector<SourceFile> list_source(const stdfs::path& source) {
  std::vector<SourceFile> files;
  if (!stdfs::is_directory(source)) {
    files.push_back(source_file(source, source.filename().string()));
    return files;
  }
  for (auto it = stdfs::recursive_directory_iterator(
           source, stdfs::directory_options::follow_directory_symlink);
       it != stdfs::recursive_directory_iterator(); ++it) {
    if (it->is_regular_file())
      files.push_back(source_file(it->path(), stdfs::relative(it->path(), source).string()));
  }
  std::sort(files.begin(), files.end(),
            [](const SourceFile& a, const SourceFile& b) { return a.relative < b.relative; });
  return files;
}

std::string hash_of(const std::string& path) { return xxh3_file(path).second; }

// Holds an exclusive flock(2) on `path` for its lifetime: one process stages at a time.
class StageLock {
 public:
  explicit StageLock(const std::string& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) throw IoError("open", path, errno);
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) throw IoError("flock", path, errno);
    }
  }
  ~StageLock() { ::close(fd_); }
  StageLock(const StageLock&) = delete;
  StageLock& operator=(const StageLock&) = delete;

 private:
  int fd_;
};

// Logs the copy's progress at most every 2 s.
class Progress {
 public:
  explicit Progress(int64_t total) : total_(total) {}
  void add(size_t n) {
    done_ += static_cast<int64_t>(n);
    if (since(last_) < 2) return;
    last_ = Clock::now();
    const double rate = static_cast<double>(done_) / std::max(since(start_), 1e-9);
    spdlog::info("staging data: {} of {} ({:.0f}%), {}/s", format_bytes(done_),
                 format_bytes(total_),
                 100.0 * static_cast<double>(done_) / std::max<int64_t>(total_, 1),
                 format_bytes(static_cast<int64_t>(rate)));
  }

 private:
  int64_t total_, done_ = 0;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now();
};

}  // namespace

json StageResult::to_json() const {
  return {{"source", source},
          {"copy", copy},
          {"files", files},
          {"bytes", bytes},
          {"copied_files", copied_files},
          {"copied_bytes", copied_bytes},
          {"seconds", seconds}};
}

std::string StageResult::describe(const std::string& key) const {
  std::string text = "staged " + key + " " + source + " in " + copy + ": " + std::to_string(files) +
                     (files == 1 ? " file, " : " files, ") + format_bytes(bytes) + "; ";
  if (copied_files == 0)
    return text + "every file unchanged, reused (checked in " + fmt::format("{:.2f} s)", seconds);
  return text + std::to_string(copied_files) + " copied (" + format_bytes(copied_bytes) +
         fmt::format(" in {:.2f} s), ", seconds) + std::to_string(files - copied_files) + " reused";
}

StageResult stage_path(const std::string& source, const std::string& stage_dir,
                       const std::string& key) {
  const auto start = Clock::now();
  std::error_code ec;
  // A bucket's objects are listed once (the ETag is their version, as the mtime is a file's)
  // and downloaded with parallel ranged GETs; the rest is as for files.
  const std::optional<S3Url> url = S3Url::parse(source);
  std::unique_ptr<S3Client> client;
  std::vector<SourceFile> objects;
  if (url) {
    client = std::make_unique<S3Client>(S3Settings::from_environment(), url->bucket);
    client->check_bucket();
    objects = list_objects(*client, *url);
    if (objects.empty())
      throw ConfigError("data.stage_dir: " + key + " " + source +
                        " holds no object, so there is nothing to stage");
  }
  const stdfs::path abs = url ? stdfs::path(source.substr(5)).lexically_normal()
                              : stdfs::absolute(source, ec).lexically_normal();
  if (source.empty() || (!url && !stdfs::exists(abs, ec)))
    throw ConfigError("data.stage_dir: " + key + " " + source +
                      " does not exist, so there is "
                      "nothing to stage");
  stdfs::path name = abs.filename().empty() ? abs.parent_path().filename() : abs.filename();
  const std::string folder =
      name.string() + "-" + xxh3_hex(url ? source : abs.string()).substr(0, 8);
  const stdfs::path root = stdfs::path(stage_dir) / folder;
  fs::make_dirs(root.string());
  const StageLock lock((stdfs::path(stage_dir) / ("." + folder + ".lock")).string());

  StageResult result;
  result.source = source;
  // An object named by the URL itself is staged as a file; a prefix as a folder.
  const bool is_dir = url ? !(objects.size() == 1 && objects.front().path == url->prefix)
                          : stdfs::is_directory(abs);
  result.copy = is_dir ? root.string() : (root / abs.filename()).string();
  const std::vector<SourceFile> files = url ? objects : list_source(abs);

  json record =
      json::parse(fs::exists((root / kRecord).string()) ? fs::read_file((root / kRecord).string())
                                                        : std::string("{}"),
                  nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || !record.contains("files") || !record["files"].is_object())
    record = {{"source", abs.string()}, {"files", json::object()}};
  json& entries = record["files"];

  // What changed, and how much to copy (for the progress line).
  std::vector<const SourceFile*> to_copy;
  for (const SourceFile& f : files) {
    result.files += 1;
    result.bytes += f.bytes;
    const std::string copy = (root / f.relative).string();
    const auto it = entries.find(f.relative);
    const bool reusable = it != entries.end() && it->value("bytes", int64_t{-1}) == f.bytes &&
                          it->value("mtime_ns", int64_t{-1}) == f.mtime_ns &&
                          it->value("etag", std::string()) == f.etag &&
                          fs::file_size(copy) == f.bytes &&
                          hash_of(copy) == it->value("xxh3", std::string());
    if (!reusable) to_copy.push_back(&f);
  }
  int64_t copy_total = 0;
  for (const SourceFile* f : to_copy) copy_total += f->bytes;
  Progress progress(copy_total);
  for (const SourceFile* f : to_copy) {
    const stdfs::path copy = root / f->relative;
    fs::make_dirs(copy.parent_path().string());
    const std::string tmp = copy.string() + ".tmp-" + std::to_string(::getpid());
    std::optional<Xxh3> passing;
    int64_t n = 0;
    try {
      const auto observe = [&](const char* data, size_t size) {
        passing->update(data, size);
        progress.add(size);
      };
      if (client) {  // retried by the client, part by part
        n = fs::write_streamed(
            tmp, [&](const ByteSink& out) { client->download(f->path, f->bytes, out); }, observe,
            [&] { passing.emplace(); });
      } else {
        n = fs::with_retries([&] {
          passing.emplace();
          return fs::copy_file(f->path, tmp, observe);
        });
      }
    } catch (const IoError& e) {
      ::unlink(tmp.c_str());  // a full disk must not stay full of a half copy
      const bool full = e.error_number() == ENOSPC || e.error_number() == EDQUOT;
      throw IoError("copy" +
                        (full ? " (staging needs " + format_bytes(copy_total) +
                                    " free for the files that changed)"
                              : std::string()) +
                        " to " + tmp + " from",
                    f->path, e.error_number());
    }
    const std::string written = hash_of(tmp);
    if (n != f->bytes || written != passing->hex()) {
      ::unlink(tmp.c_str());
      throw IoError("stage (the copy of " + std::to_string(n) + " bytes, xxh3 " + written +
                        ", differs from the source's " + std::to_string(f->bytes) +
                        " bytes, xxh3 " + passing->hex() + "; did it change while copied?)",
                    f->path, EIO);
    }
    fs::rename_durable(tmp, copy.string());
    entries[f->relative] = {{"bytes", f->bytes}, {"mtime_ns", f->mtime_ns}, {"xxh3", written}};
    if (client) entries[f->relative]["etag"] = f->etag;
    // Recorded file by file: a start cut short keeps what it copied.
    fs::replace_file((root / kRecord).string(), record.dump(2) + "\n");
    result.copied_files += 1;
    result.copied_bytes += n;
  }
  // Files the source no longer has must not be read as part of it.
  for (auto it = entries.begin(); it != entries.end();) {
    const bool present = std::any_of(files.begin(), files.end(),
                                     [&](const SourceFile& f) { return f.relative == it.key(); });
    if (present) {
      ++it;
      continue;
    }
    fs::remove_all((root / it.key()).string());
    it = entries.erase(it);
    fs::replace_file((root / kRecord).string(), record.dump(2) + "\n");
  }
  result.seconds = since(start);
  return result;
}

std::string default_stage_dir() { return fs::cache_dir() + "/data"; }

json stage_data(DataConfig& data, bool log) {
  json staged = json::array();
  if (data.name == "synthetic") {
    if (log) spdlog::info("data.stage_dir: the synthetic data set reads no files; nothing staged");
    return staged;
  }
  // tokens reads a val.bin beside data.path by default: staged with it, or the staged copy,
  // alone in its folder, would evaluate on a held-out share of the training file instead.
  if (data.name == "tokens") data.eval_path = tokens_eval_file(data);
  std::error_code ec;
  const stdfs::path dir = stdfs::weakly_canonical(stdfs::absolute(data.stage_dir, ec), ec);
  for (auto [key, path] : {std::pair<const char*, std::string*>{"data.path", &data.path},
                           {"data.eval_path", &data.eval_path}}) {
    if (path->empty()) continue;
    // A stage dir inside the source would be staged again with it, growing every start.
    const stdfs::path source = stdfs::weakly_canonical(stdfs::absolute(*path, ec), ec);
    const auto [mismatch, rest] =
        std::mismatch(source.begin(), source.end(), dir.begin(), dir.end());
    if (mismatch == source.end() && !is_s3_url(*path))
      throw ConfigError("data.stage_dir " + dir.string() + " is inside " + key + " " + *path +
                        ": it would be staged with the data; choose a directory outside it");
    StageResult r;
    try {
      r = stage_path(*path, dir.string(), key);
    } catch (const IoError& e) {
      const std::string what = "data.stage_dir: cannot stage " + std::string(key) + " " + *path +
                               " in " + dir.string() + " (" + e.what() + ")";
      // A transient error of network storage that the retries did not get past may still pass
      // (exit 1: a supervisor tries again); a full, read-only or forbidden place, or a missing
      // source, is the configuration's to fix (exit 2, not retried).
      if (fs::is_transient(e.error_number())) throw Error(what);
      throw ConfigError(what);
    }
    if (log) spdlog::info("{}", r.describe(key));
    *path = r.copy;
    staged.push_back(r.to_json());
  }
  return staged;
}

}  // namespace gpurun

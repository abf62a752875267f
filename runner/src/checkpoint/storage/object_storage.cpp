#include "checkpoint/storage/object_storage.h"

#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/format/checkpoint_types.h"
#include "checkpoint/format/folder.h"
#include "checkpoint/storage/posix_storage.h"
#include "gpurun/errors.h"
#include "s3/s3_client.h"
#include "util/faults.h"
#include "util/text.h"

namespace gpurun {
namespace {

// Objects up to this size are read in one GET of whatever version is current (read()).
constexpr int64_t kWholeReadBytes = int64_t{1} << 20;

using checkpoint_folder::kManifest;

constexpr const char* kDamaged = ".damaged";

// The 8 MiB pieces this process's uploads took in, for the test-only fault point "s3_upload".
std::atomic<int64_t> uploaded_pieces{0};

// S3 says "no such key" with a 404; the protocol's readers ask for ENOENT, as of a file.
[[noreturn]] void rethrow_missing_as_enoent(const S3Error& e, const std::string& path) {
  if (e.http_status() == 404) throw IoError("read", path, ENOENT);
  throw e;
}

std::string random_hex() {
  std::random_device device;
  return fmt::format("{:08x}{:08x}", device(), device());
}

// The folder of a key under the root ("ckpt-e0001-s0000010" for "P/ckpt-e0001-s0000010/x"),
// and the file's name in it; {"", name} for a key at the root.
std::pair<std::string, std::string> split_key(const std::string& relative) {
  const size_t slash = relative.find('/');
  if (slash == std::string::npos) return {"", relative};
  return {relative.substr(0, slash), relative.substr(slash + 1)};
}

class ObjectFolderWrite final : public FolderWrite {
 public:
  ObjectFolderWrite(ObjectStorage& storage, std::string name)
      : storage_(storage), name_(std::move(name)) {
    // An incomplete or damaged folder of that name is replaced: its manifest goes first, so
    // that no reader takes the old manifest over the new files, then its markers (the new
    // checkpoint is a new one).
    S3Client& client = storage_.client();
    client.remove(storage_.key(name_ + "/" + kManifest));
    std::vector<std::string> markers;
    for (const std::string& aside : storage_.set_aside_names()) {
      if (aside.rfind(name_ + kDamaged, 0) == 0) markers.push_back(storage_.key(aside));
    }
    if (!markers.empty()) client.remove(markers);
  }
  ~ObjectFolderWrite() override {
    if (!done_) abort();
  }

  int64_t write(const std::string& name, const ByteSource& source, const ByteSink& observe,
                const std::function<void()>& restart) override {
    // The client retries each part from its own buffer: `source` runs once.
    if (restart) restart();
    int64_t passed = 0, next_part = kFaultBytes;
    const S3Object object =
        storage_.client().upload(storage_.key(name_ + "/" + name), [&](const ByteSink& out) {
          source([&](const char* data, size_t size) {
            if (observe) observe(data, size);
            out(data, size);
            passed += static_cast<int64_t>(size);
            while (passed >= next_part) {
              fault_point("s3_upload", ++uploaded_pieces);
              next_part += kFaultBytes;
            }
          });
        });
    return object.size;
  }

  void adopt(const std::string& name, const std::string& path) override {
    const std::pair<std::string, std::string> where = split_folder_path(path);
    const PosixStorage local(where.first);
    const std::string& file = where.second;
    write(name, [&](const ByteSink& out) { local.read(file, out); }, {}, {});
  }

  void commit(const std::string& manifest, const std::function<void()>& before_commit,
              std::timed_mutex& commit_mutex) override {
    if (before_commit) before_commit();
    const std::lock_guard<std::timed_mutex> commit(commit_mutex);
    storage_.client().put(storage_.key(name_ + "/" + kManifest), manifest);
    done_ = true;
  }

  void abort() noexcept override {
    done_ = true;
    try {
      storage_.remove_folder(name_);
    } catch (const std::exception& e) {
      spdlog::warn(
          "could not remove the objects of a failed save under {}: {} (the next start "
          "removes them)",
          storage_.path(name_), e.what());
    }
  }

 private:
  // A test-only fault point ("s3_upload", util/faults.h) every 8 MiB a file's upload takes in.
  static constexpr int64_t kFaultBytes = 8 << 20;
  ObjectStorage& storage_;
  std::string name_;
  bool done_ = false;
};

}  // namespace

ObjectStorage::ObjectStorage(const std::string& root) : root_(root), url_(*S3Url::parse(root)) {
  root_ = url_.str();
  // A request is retried for 30 s: within the lease's default timeout (60 s), so that storage
  // that stays down ends a heartbeat, a save or a stop in time (the copy to the bucket is
  // retried by the tier copier, a failed save by the next one).
  S3Client::Options options;
  options.retry_seconds = 30;
  client_ = std::make_unique<S3Client>(S3Settings::from_environment(), url_.bucket, options);
}

ObjectStorage::~ObjectStorage() = default;

void ObjectStorage::check_writable(const std::string& what) {
  static std::once_flag logged;  // checked twice at a start: before the session, and at the claim
  std::call_once(logged,
                 [&] { spdlog::info("{} {}: {}", what, root_, client_->settings().describe()); });
  client_->check_bucket();
  const std::string probe = key(".gpurun-probe-" + random_hex());
  try {
    client_->put(probe, "gpurun probe\n");
    client_->remove(probe);
  } catch (const S3Error& e) {
    throw ConfigError(what + " " + root_ + " cannot be written (" + e.what() +
                      "); choose a bucket and prefix these credentials may write");
  }
}

void ObjectStorage::check_readable() { client_->check_bucket(); }

std::string ObjectStorage::lease_problem() {
  // The lease is a compare-and-swap on lease.json: a server that ignores the conditions would
  // let two runs hold it. Checked with a probe of our own, never on lease.json.
  const std::string probe = key(".gpurun-conditional-probe-" + random_hex());
  std::string problem;
  const auto first = client_->put(probe, "1", S3Client::Condition::kIfAbsent);
  if (!first) {
    problem = "a create with If-None-Match: * of a new object failed";
  } else if (client_->put(probe, "2", S3Client::Condition::kIfAbsent)) {
    problem = "a PUT with If-None-Match: * replaced an existing object";
  } else if (client_->put(probe, "3", S3Client::Condition::kIfMatch, "0123456789abcdef")) {
    problem = "a PUT with If-Match of another ETag replaced the object";
  }
  client_->remove(probe);
  return problem.empty() ? ""
                         : client_->settings().endpoint + " does not enforce conditional writes (" +
                               problem + ")";
}

std::vector<std::string> ObjectStorage::folders() const {
  // One listing of the whole root: a folder is there once its manifest is, unless a marker
  // sets it aside.
  const std::string base = key("");  // "PREFIX/", or "" at the bucket's root
  std::set<std::string> with_manifest, aside;
  for (const S3Object& object : client_->list(base).objects) {
    const auto [folder, file] = split_key(object.key.substr(base.size()));
    if (folder.empty()) {
      const size_t mark = file.find(kDamaged);
      if (starts_with(file, "ckpt-") && mark != std::string::npos)
        aside.insert(file.substr(0, mark));
    } else if (file == kManifest && is_checkpoint_folder_name(folder)) {
      with_manifest.insert(folder);
    }
  }
  std::vector<std::string> names;
  for (const std::string& name : with_manifest) {
    if (!aside.count(name)) names.push_back(name);
  }
  return names;
}

std::vector<std::string> ObjectStorage::set_aside_names() const {
  const std::string base = key("");  // "PREFIX/", or "" at the bucket's root
  std::vector<std::string> names;
  for (const S3Object& object : client_->list(base + "ckpt-", "/").objects) {
    const std::string name = object.key.substr(base.size());
    if (name.find(kDamaged) != std::string::npos) names.push_back(name);
  }
  return names;
}

bool ObjectStorage::has_folder(const std::string& name) const {
  return client_->head(key(name + "/" + kManifest)).has_value();
}

StoredFile ObjectStorage::status(const std::string& name) const {
  const std::optional<S3Object> object = client_->head(key(name));
  if (!object) return {};
  return {object->size, true};
}

void ObjectStorage::read(const std::string& name, const ByteSink& out) const {
  const std::optional<S3Object> object = client_->head(key(name));
  if (!object) throw IoError("read", path(name), ENOENT);
  try {
    // A small object is read whole, as it is at the GET: lease.json and LATEST are replaced in
    // place (a heartbeat every 0.5 s), so the size the HEAD saw may be another version's. A
    // checkpoint's files never change once written: their size is checked.
    if (object->size <= kWholeReadBytes)
      client_->get(key(name), 0, -1, out);
    else
      client_->download(key(name), object->size, out);
  } catch (const S3Error& e) {
    rethrow_missing_as_enoent(e, path(name));
  }
}

std::unique_ptr<FolderWrite> ObjectStorage::write_folder(const std::string& name) {
  return std::make_unique<ObjectFolderWrite>(*this, name);
}

void ObjectStorage::replace(const std::string& name, const std::string& bytes) {
  client_->put(key(name), bytes);
}

void ObjectStorage::remove_folder(const std::string& name) {
  // The manifest first: from then on no reader takes the folder, whatever is left of it.
  client_->remove(key(name + "/" + kManifest));
  std::vector<std::string> keys;
  for (const S3Object& object : client_->list(key(name) + "/").objects) keys.push_back(object.key);
  if (!keys.empty()) client_->remove(keys);
}

std::string ObjectStorage::set_aside(const std::string& name) {
  // A marker beside the folder, written only if absent: two resumes never share one.
  for (int n = 0;; ++n) {
    const std::string aside = name + kDamaged + (n ? "." + std::to_string(n) : "");
    if (client_->put(key(aside), "set aside as damaged\n", S3Client::Condition::kIfAbsent))
      return aside;
  }
}

void ObjectStorage::clean_temporaries() {
  const std::string base = key("");  // "PREFIX/", or "" at the bucket's root
  // Parts of uploads a killed writer started: stored (and billed) until aborted. Only this
  // root's own (PREFIX/ckpt-*/FILE): a run whose prefix lies under this one is another run.
  const auto ours = [&](const std::string& key) {
    const auto [folder, file] = split_key(key.substr(base.size()));
    return starts_with(folder, "ckpt-") && file.find('/') == std::string::npos;
  };
  for (const S3Upload& upload : client_->list_multipart_uploads(base)) {
    if (!ours(upload.key)) continue;
    spdlog::info("aborting the incomplete upload of {}", client_->url(upload.key));
    try {
      client_->abort_multipart_upload(upload);
    } catch (const S3Error& e) {
      spdlog::warn("could not abort the upload of {}: {}", client_->url(upload.key), e.what());
    }
  }
  // Folders whose manifest was never written, and probes of a start that was killed.
  std::map<std::string, std::vector<std::string>> files_of;
  std::set<std::string> committed;
  std::vector<std::string> doomed;
  for (const S3Object& object : client_->list(base).objects) {
    const auto [folder, file] = split_key(object.key.substr(base.size()));
    if (folder.empty()) {
      if (starts_with(file, ".gpurun-")) doomed.push_back(object.key);
      continue;
    }
    if (file.find('/') != std::string::npos) continue;  // another run's, under this prefix
    files_of[folder].push_back(object.key);
    if (file == kManifest) committed.insert(folder);
  }
  for (const auto& [folder, keys] : files_of) {
    if (committed.count(folder) || !starts_with(folder, "ckpt-")) continue;
    spdlog::info("removing the {} objects of {}, whose save never completed", keys.size(),
                 path(folder));
    doomed.insert(doomed.end(), keys.begin(), keys.end());
  }
  if (doomed.empty()) return;
  try {
    client_->remove(doomed);
  } catch (const S3Error& e) {
    spdlog::warn("could not remove leftovers under {}: {}", root_, e.what());
  }
}

bool ObjectStorage::replace_if(const std::string& name, const std::string& bytes,
                               const Expect& expect) {
  // Judged on the bytes read, written only over the version judged (If-Match on its ETag), or
  // only where nothing is (If-None-Match: *): a concurrent writer makes the write fail.
  const std::optional<S3Object> object = client_->head(key(name));
  std::optional<std::string> current;
  if (object) {
    try {
      current = client_->get(key(name));
    } catch (const S3Error& e) {
      if (e.http_status() != 404) throw;
      return false;  // removed since: judge again
    }
  }
  if (!expect(current)) return false;
  if (!object) return client_->put(key(name), bytes, S3Client::Condition::kIfAbsent).has_value();
  return client_->put(key(name), bytes, S3Client::Condition::kIfMatch, object->etag).has_value();
}

bool ObjectStorage::remove_if(const std::string& name, const Expect& expect) {
  std::optional<std::string> current;
  try {
    current = client_->get(key(name));
  } catch (const S3Error& e) {
    if (e.http_status() != 404) throw;
  }
  if (!expect(current)) return false;
  client_->remove(key(name));
  return true;
}

}  // namespace gpurun

#include "checkpoint/storage/posix_storage.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/format/checkpoint_types.h"
#include "checkpoint/format/folder.h"
#include "gpurun/errors.h"
#include "util/fd_io.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/text.h"
#include "util/writable.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using checkpoint_folder::join;
using checkpoint_folder::kManifest;

std::string pid_string() { return std::to_string(::getpid()); }

std::optional<std::string> read_if_present(const std::string& path) {
  try {
    return fs::read_file(path);
  } catch (const IoError& e) {
    if (e.error_number() == ENOENT) return std::nullopt;
    throw;
  }
}

class PosixFolderWrite final : public FolderWrite {
 public:
  PosixFolderWrite(std::string dir, std::string name)
      : dir_(std::move(dir)),
        name_(std::move(name)),
        tmp_(join(dir_, ".tmp-" + name_ + "-" + pid_string())) {
    fs::make_dirs(dir_);
    fs::remove_all(tmp_);  // left by an earlier process that had the same pid
    fs::make_dirs(tmp_);
  }
  ~PosixFolderWrite() override {
    if (!done_) abort();
  }

  int64_t write(const std::string& name, const ByteSource& source, const ByteSink& observe,
                const std::function<void()>& restart) override {
    return fs::write_streamed(join(tmp_, name), source, observe, restart);
  }

  void adopt(const std::string& name, const std::string& path) override {
    // Written and fsync'd by its rank in a folder of this root: a rename moves it, and the
    // folder's fsync at the commit makes that durable.
    fs::rename_durable(path, join(tmp_, name));
  }

  void commit(const std::string& manifest, const std::function<void()>& before_commit,
              std::timed_mutex& commit_mutex) override {
    fs::write_file(join(tmp_, kManifest), manifest);
    fs::sync_dir(tmp_);
    if (before_commit) before_commit();
    const std::string final_path = join(dir_, name_);
    if (fs::exists(final_path)) PosixStorage(dir_).remove_folder(name_);
    const std::lock_guard<std::timed_mutex> commit(commit_mutex);
    fs::rename_durable(tmp_, final_path);
    done_ = true;
  }

  void abort() noexcept override {
    done_ = true;
    try {
      fs::remove_all(tmp_);
    } catch (const std::exception& e) {
      spdlog::warn("could not remove the temporary folder of a failed save: {}", e.what());
    }
  }

 private:
  std::string dir_, name_, tmp_;
  bool done_ = false;
};

std::atomic<unsigned> temp_counter{0};

}  // namespace

PosixStorage::PosixStorage(std::string dir) : dir_(std::move(dir)) {}

void PosixStorage::check_writable(const std::string& what) {
  try {
    probe_writable(dir_);
  } catch (const IoError& e) {
    throw ConfigError((what == "--ckpt" ? "checkpoint directory " : what + " ") + dir_ +
                      " cannot be written (" + e.what() + "); choose a " + what +
                      " directory where files can be created");
  }
}

std::vector<std::string> PosixStorage::folders() const {
  std::vector<std::string> names;
  for (const auto& name : fs::list_dir(dir_)) {
    std::error_code ec;
    if (is_checkpoint_folder_name(name) && stdfs::is_directory(join(dir_, name), ec))
      names.push_back(name);
  }
  return names;
}

std::vector<std::string> PosixStorage::set_aside_names() const {
  std::vector<std::string> names;
  for (const auto& name : fs::list_dir(dir_)) {
    if (starts_with(name, "ckpt-") && !is_checkpoint_folder_name(name)) names.push_back(name);
  }
  return names;
}

bool PosixStorage::has_folder(const std::string& name) const {
  std::error_code ec;
  return stdfs::exists(join(dir_, name), ec);
}

StoredFile PosixStorage::status(const std::string& name) const {
  const fs::FileStatus s = fs::status(join(dir_, name));
  return {s.size, s.regular};
}

void PosixStorage::read(const std::string& name, const ByteSink& out) const {
  const std::string path = join(dir_, name);
  // Not retried here: `out` would see bytes twice. A copy is retried whole by its caller.
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError("open", path, errno);
    std::vector<char> buffer(8 << 20);
    try {
      for (off_t at = 0;;) {
        const size_t n = fs::pread_full(fd, buffer.data(), buffer.size(), at, path);
        if (n == 0) break;
        out(buffer.data(), n);
        at += static_cast<off_t>(n);
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }
}

std::pair<int64_t, std::string> PosixStorage::checksum(const std::string& name) const {
  return xxh3_file(join(dir_, name));
}

std::unique_ptr<FolderWrite> PosixStorage::write_folder(const std::string& name) {
  return std::make_unique<PosixFolderWrite>(dir_, name);
}

void PosixStorage::replace(const std::string& name, const std::string& bytes) {
  fs::replace_file(join(dir_, name), bytes);
}

void PosixStorage::remove_folder(const std::string& name) {
  // Renamed out of the readers' sight first: a folder half removed is never listed.
  const std::string doomed = join(dir_, ".tmp-del-" + name + "-" + pid_string());
  fs::remove_all(doomed);
  fs::rename_durable(join(dir_, name), doomed);
  fs::remove_all(doomed);
}

std::string PosixStorage::set_aside(const std::string& name) {
  std::string aside = name + ".damaged";
  for (int n = 1; fs::exists(join(dir_, aside)); ++n)
    aside = name + ".damaged." + std::to_string(n);
  fs::rename_durable(join(dir_, name), join(dir_, aside));
  return aside;
}

void PosixStorage::clean_temporaries() {
  // .tmp-* are checkpoint folders being written or deleted; .LATEST.tmp-* are replace_file()'s
  // temporaries of LATEST. Only the store writes either, so none can belong to a live writer
  // as long as this is not called while a save runs.
  const auto is_temporary = [](const std::string& name) {
    return starts_with(name, ".tmp-") || starts_with(name, ".LATEST.tmp-");
  };
  for (const auto& name : fs::list_dir(dir_)) {
    if (!is_temporary(name)) continue;
    const std::string path = join(dir_, name);
    spdlog::info("removing leftover temporary {}", path);
    try {
      fs::remove_all(path);
    } catch (const IoError& e) {
      spdlog::warn("could not remove {}: {}", path, e.what());
    }
  }
}

bool PosixStorage::replace_if(const std::string& name, const std::string& bytes,
                              const Expect& expect) {
  // Written to a temporary file beside it (with fsync, the slow part), then the file is read
  // again and the temporary renamed over it only when `expect` holds: the window in which a
  // concurrent writer can slip in is from that read to the rename, not the whole write. The
  // temporary's name carries pid and a counter, so it never meets another writer's nor
  // fs::replace_file's (".NAME.tmp-PID-N").
  fs::make_dirs(dir_);
  const std::string tmp =
      join(dir_, "." + name + ".tmp-" + pid_string() + "-c" + std::to_string(temp_counter++));
  try {
    fs::write_file(tmp, bytes);
    if (!expect(read_if_present(join(dir_, name)))) {
      ::unlink(tmp.c_str());
      return false;
    }
    fs::rename_durable(tmp, join(dir_, name));
    return true;
  } catch (...) {
    ::unlink(tmp.c_str());  // best effort; the error that matters is the one rethrown
    throw;
  }
}

bool PosixStorage::remove_if(const std::string& name, const Expect& expect) {
  const std::string path = join(dir_, name);
  if (!expect(read_if_present(path))) return false;
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw IoError("unlink", path, errno);
  fs::sync_dir(dir_);
  return true;
}

}  // namespace gpurun

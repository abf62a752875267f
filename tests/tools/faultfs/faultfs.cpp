// faultfs: a FUSE pass-through file system over a directory that fails the way network storage
// does, for gpurun's fault tests (docs/architecture.md, "Fault tests"). Every operation on
// MOUNTPOINT is done on SOURCE, through the kernel, unless a rule of the control file says
// otherwise. The control file is read again whenever it changes (write a new one and rename it
// over the old), so faults turn on and off while the file system runs.
//
//   faultfs SOURCE MOUNTPOINT --control FILE [--log FILE]
//
// Control file: one rule a line, `#` starts a comment. OPS is a comma-separated list of
// open, create, read, write, fsync (files and folders), rename, unlink, mkdir, rmdir, getattr,
// readdir, truncate, setattr (times, mode), statfs, or `*` for all of them; SUBSTR limits a rule
// to paths (relative to the mount, with a leading /; a rename's are "FROM TO") that contain it.
//
//   readonly                                  operations that change anything answer EROFS
//   delay OPS MS [path SUBSTR]                 each matching operation first waits MS ms
//   error OPS ERRNO [after N] [prob P] [path SUBSTR]
//                                             matching operations answer ERRNO (EIO, ENOSPC,
//                                             EDQUOT, ESTALE, EROFS, EACCES, ETIMEDOUT): after
//                                             the first N of them, each with probability P
//   hang OPS [path SUBSTR]                     matching operations block until the rule is
//                                             removed; an interrupted one answers EINTR
//   seed S                                    the random generator's seed (default 1)
//
// --log FILE gets one line per fault injected: "<kind> <op> <path>", kind being the errno's
// name, "delay", "hang" or "EROFS" (readonly). Interrupts are on (fuse_config::intr), so that a
// process blocked in a hung operation can be interrupted (FUSE_INTERRUPT), and with no attribute or
// entry caching, so that the source's state is what every call sees.
#define FUSE_USE_VERSION 31

#include <dirent.h>
#include <fcntl.h>
#include <fuse.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Rule {
  enum class Kind { kDelay, kError, kHang } kind;
  std::set<std::string> ops;  ///< empty: every operation
  std::string path;           ///< substring the path must contain ("" any)
  int err = 0;
  int ms = 0;
  int64_t after = 0;
  double prob = 1.0;
  int64_t seen = 0;  ///< matching calls so far
};

struct Rules {
  bool readonly = false;
  std::vector<Rule> rules;
  std::mt19937_64 rng{1};
};

const std::map<std::string, int>& errnos() {
  static const std::map<std::string, int> names{
      {"EIO", EIO},       {"ENOSPC", ENOSPC}, {"EDQUOT", EDQUOT},       {"ESTALE", ESTALE},
      {"EROFS", EROFS},   {"EACCES", EACCES}, {"ETIMEDOUT", ETIMEDOUT}, {"EPERM", EPERM},
      {"ENOENT", ENOENT}, {"EINTR", EINTR}};
  return names;
}

std::string errno_name(int err) {
  for (const auto& [name, value] : errnos())
    if (value == err) return name;
  return std::to_string(err);
}

std::string source_root;
std::string control_path;
std::string log_path;
std::mutex mutex;  // guards everything below
Rules current;
struct stat control_stat {};
bool have_control = false;
std::unique_ptr<std::ofstream> log_file;

/// Parses the control file's text; a malformed line is reported on stderr and skipped.
Rules parse(const std::string& text) {
  Rules out;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string kind;
    if (!(words >> kind)) continue;
    if (kind == "readonly") {
      out.readonly = true;
      continue;
    }
    if (kind == "seed") {
      uint64_t seed = 1;
      words >> seed;
      out.rng.seed(seed);
      continue;
    }
    Rule rule{};
    std::string ops;
    if (kind == "delay") {
      rule.kind = Rule::Kind::kDelay;
      words >> ops >> rule.ms;
    } else if (kind == "error") {
      rule.kind = Rule::Kind::kError;
      std::string name;
      words >> ops >> name;
      auto it = errnos().find(name);
      if (it == errnos().end()) {
        std::fprintf(stderr, "faultfs: %s:%d: unknown errno %s\n", control_path.c_str(), number,
                     name.c_str());
        continue;
      }
      rule.err = it->second;
    } else if (kind == "hang") {
      rule.kind = Rule::Kind::kHang;
      words >> ops;
    } else {
      std::fprintf(stderr, "faultfs: %s:%d: unknown rule %s\n", control_path.c_str(), number,
                   kind.c_str());
      continue;
    }
    std::istringstream op_list(ops);
    for (std::string op; std::getline(op_list, op, ',');)
      if (op != "*" && !op.empty()) rule.ops.insert(op);
    for (std::string key; words >> key;) {
      if (key == "after")
        words >> rule.after;
      else if (key == "prob")
        words >> rule.prob;
      else if (key == "path")
        words >> rule.path;
    }
    out.rules.push_back(rule);
  }
  return out;
}

/// Reads the control file again when it changed (holds `mutex`).
void refresh() {
  if (control_path.empty()) return;
  struct stat st {};
  if (::stat(control_path.c_str(), &st) != 0) {
    if (have_control) current = Rules{};
    have_control = false;
    return;
  }
  if (have_control && st.st_ino == control_stat.st_ino && st.st_size == control_stat.st_size &&
      st.st_mtim.tv_sec == control_stat.st_mtim.tv_sec &&
      st.st_mtim.tv_nsec == control_stat.st_mtim.tv_nsec)
    return;
  std::ifstream in(control_path);
  std::stringstream text;
  text << in.rdbuf();
  current = parse(text.str());
  control_stat = st;
  have_control = true;
}

void log_fault(const std::string& kind, const char* op, const char* path) {
  if (!log_file) return;
  *log_file << kind << ' ' << op << ' ' << path << '\n';
  log_file->flush();
}

bool matches(const Rule& r, const char* op, const char* path) {
  return (r.ops.empty() || r.ops.count(op)) &&
         (r.path.empty() || std::strstr(path, r.path.c_str()) != nullptr);
}

/// Whether a hang rule still holds `op` on `path`.
bool still_hung(const char* op, const char* path) {
  std::lock_guard<std::mutex> lock(mutex);
  refresh();
  for (const Rule& r : current.rules)
    if (r.kind == Rule::Kind::kHang && matches(r, op, path)) return true;
  return false;
}

/// Applies the rules to one operation before it is done: 0 to go on, or -errno to answer.
/// `changes`: the operation modifies the file system (readonly refuses it).
int inject(const char* op, const char* path, bool changes) {
  int delay_ms = 0;
  bool hang = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    refresh();
    if (changes && current.readonly) {
      log_fault("EROFS", op, path);
      return -EROFS;
    }
    for (Rule& r : current.rules) {
      if (!matches(r, op, path)) continue;
      switch (r.kind) {
        case Rule::Kind::kDelay:
          delay_ms += r.ms;
          break;
        case Rule::Kind::kHang:
          hang = true;
          break;
        case Rule::Kind::kError: {
          if (++r.seen <= r.after) break;
          if (r.prob < 1.0 && std::uniform_real_distribution<double>(0, 1)(current.rng) >= r.prob)
            break;
          log_fault(errno_name(r.err), op, path);
          return -r.err;
        }
      }
    }
    if (delay_ms > 0) log_fault("delay", op, path);
    if (hang) log_fault("hang", op, path);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms);
  while (std::chrono::steady_clock::now() < until) {
    if (fuse_interrupted()) return -EINTR;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(delay_ms, 5)));
  }
  while (hang && still_hung(op, path)) {
    if (fuse_interrupted()) return -EINTR;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

std::string real(const char* path) { return source_root + path; }

int fail(int r) { return r < 0 ? -errno : r; }

// The operations: each asks inject() first, then does the same on SOURCE.

int fs_getattr(const char* path, struct stat* st, fuse_file_info* fi) {
  if (int e = inject("getattr", path, false)) return e;
  return fail(fi ? ::fstat(static_cast<int>(fi->fh), st) : ::lstat(real(path).c_str(), st));
}

int fs_opendir(const char* path, fuse_file_info* fi) {
  if (int e = inject("readdir", path, false)) return e;
  const int fd = ::open(real(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -errno;
  fi->fh = static_cast<uint64_t>(fd);
  return 0;
}

int fs_readdir(const char* path, void* buf, fuse_fill_dir_t fill, off_t, fuse_file_info* fi,
               fuse_readdir_flags) {
  if (int e = inject("readdir", path, false)) return e;
  const int fd = ::dup(static_cast<int>(fi->fh));
  if (fd < 0) return -errno;
  DIR* dir = ::fdopendir(fd);
  if (!dir) {
    const int err = errno;
    ::close(fd);
    return -err;
  }
  ::rewinddir(dir);
  while (dirent* entry = ::readdir(dir)) {
    struct stat st {};
    st.st_ino = entry->d_ino;
    st.st_mode = static_cast<mode_t>(DTTOIF(entry->d_type));
    if (fill(buf, entry->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0))) break;
  }
  ::closedir(dir);
  return 0;
}

int fs_releasedir(const char*, fuse_file_info* fi) {
  return fail(::close(static_cast<int>(fi->fh)));
}

int fs_fsyncdir(const char* path, int, fuse_file_info* fi) {
  if (int e = inject("fsync", path, false)) return e;
  return fail(::fsync(static_cast<int>(fi->fh)));
}

bool writes(int flags) { return (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC); }

int fs_open(const char* path, fuse_file_info* fi) {
  if (int e = inject("open", path, writes(fi->flags))) return e;
  const int fd = ::open(real(path).c_str(), fi->flags & ~O_NOFOLLOW);
  if (fd < 0) return -errno;
  fi->fh = static_cast<uint64_t>(fd);
  return 0;
}

int fs_create(const char* path, mode_t mode, fuse_file_info* fi) {
  if (int e = inject("create", path, true)) return e;
  const int fd = ::open(real(path).c_str(), fi->flags | O_CREAT, mode);
  if (fd < 0) return -errno;
  fi->fh = static_cast<uint64_t>(fd);
  return 0;
}

int fs_read(const char* path, char* buf, size_t n, off_t at, fuse_file_info* fi) {
  if (int e = inject("read", path, false)) return e;
  const ssize_t r = ::pread(static_cast<int>(fi->fh), buf, n, at);
  return r < 0 ? -errno : static_cast<int>(r);
}

int fs_write(const char* path, const char* buf, size_t n, off_t at, fuse_file_info* fi) {
  if (int e = inject("write", path, true)) return e;
  const ssize_t r = ::pwrite(static_cast<int>(fi->fh), buf, n, at);
  return r < 0 ? -errno : static_cast<int>(r);
}

int fs_fsync(const char* path, int datasync, fuse_file_info* fi) {
  if (int e = inject("fsync", path, false)) return e;
  const int fd = static_cast<int>(fi->fh);
  return fail(datasync ? ::fdatasync(fd) : ::fsync(fd));
}

int fs_release(const char*, fuse_file_info* fi) { return fail(::close(static_cast<int>(fi->fh))); }

int fs_rename(const char* from, const char* to, unsigned int flags) {
  // A rule's path may name either side ("path ckpt-" matches the rename that completes one).
  const std::string both = std::string(from) + " " + to;
  if (int e = inject("rename", both.c_str(), true)) return e;
  return fail(static_cast<int>(
      ::syscall(SYS_renameat2, AT_FDCWD, real(from).c_str(), AT_FDCWD, real(to).c_str(), flags)));
}

int fs_unlink(const char* path) {
  if (int e = inject("unlink", path, true)) return e;
  return fail(::unlink(real(path).c_str()));
}

int fs_mkdir(const char* path, mode_t mode) {
  if (int e = inject("mkdir", path, true)) return e;
  return fail(::mkdir(real(path).c_str(), mode));
}

int fs_rmdir(const char* path) {
  if (int e = inject("rmdir", path, true)) return e;
  return fail(::rmdir(real(path).c_str()));
}

int fs_truncate(const char* path, off_t size, fuse_file_info* fi) {
  if (int e = inject("truncate", path, true)) return e;
  return fail(fi ? ::ftruncate(static_cast<int>(fi->fh), size)
                 : ::truncate(real(path).c_str(), size));
}

int fs_utimens(const char* path, const timespec tv[2], fuse_file_info* fi) {
  if (int e = inject("setattr", path, true)) return e;
  return fail(fi ? ::futimens(static_cast<int>(fi->fh), tv)
                 : ::utimensat(AT_FDCWD, real(path).c_str(), tv, AT_SYMLINK_NOFOLLOW));
}

int fs_chmod(const char* path, mode_t mode, fuse_file_info* fi) {
  if (int e = inject("setattr", path, true)) return e;
  return fail(fi ? ::fchmod(static_cast<int>(fi->fh), mode) : ::chmod(real(path).c_str(), mode));
}

int fs_statfs(const char* path, struct statvfs* st) {
  if (int e = inject("statfs", path, false)) return e;
  return fail(::statvfs(real(path).c_str(), st));
}

int fs_access(const char* path, int mask) {
  if (int e = inject("getattr", path, false)) return e;
  return fail(::access(real(path).c_str(), mask));
}

void* fs_init(fuse_conn_info*, fuse_config* cfg) {
  cfg->use_ino = 1;
  cfg->entry_timeout = cfg->attr_timeout = cfg->negative_timeout = 0;
  cfg->intr = 1;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> fuse_args{argv[0]};
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--control" && i + 1 < argc) {
      control_path = argv[++i];
    } else if (a == "--log" && i + 1 < argc) {
      log_path = argv[++i];
    } else if (!a.empty() && a[0] == '-') {
      fuse_args.push_back(a);
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2) {
    std::fprintf(stderr, "usage: faultfs SOURCE MOUNTPOINT --control FILE [--log FILE]\n");
    return 2;
  }
  char resolved[PATH_MAX];
  if (!::realpath(positional[0].c_str(), resolved)) {
    std::perror(positional[0].c_str());
    return 2;
  }
  source_root = resolved;
  // FUSE may change the working directory: keep the other paths absolute.
  for (std::string* path : {&control_path, &log_path}) {
    if (!path->empty() && (*path)[0] != '/') {
      char cwd[PATH_MAX];
      if (::getcwd(cwd, sizeof cwd)) *path = std::string(cwd) + "/" + *path;
    }
  }
  if (!log_path.empty()) log_file = std::make_unique<std::ofstream>(log_path, std::ios::app);
  fuse_args.insert(fuse_args.end(), {positional[1], "-f", "-o", "fsname=faultfs"});

  fuse_operations ops{};
  ops.getattr = fs_getattr;
  ops.opendir = fs_opendir;
  ops.readdir = fs_readdir;
  ops.releasedir = fs_releasedir;
  ops.fsyncdir = fs_fsyncdir;
  ops.open = fs_open;
  ops.create = fs_create;
  ops.read = fs_read;
  ops.write = fs_write;
  ops.fsync = fs_fsync;
  ops.release = fs_release;
  ops.rename = fs_rename;
  ops.unlink = fs_unlink;
  ops.mkdir = fs_mkdir;
  ops.rmdir = fs_rmdir;
  ops.truncate = fs_truncate;
  ops.utimens = fs_utimens;
  ops.chmod = fs_chmod;
  ops.statfs = fs_statfs;
  ops.access = fs_access;
  ops.init = fs_init;

  // An interrupted request's thread gets SIGUSR1 (fuse_config::intr_signal). libfuse installs
  // a handler for it only when interrupts are asked for on the command line, which 3.14
  // refuses, so install one here: the default action would end faultfs.
  struct sigaction quiet {};
  quiet.sa_handler = [](int) {};
  ::sigemptyset(&quiet.sa_mask);
  ::sigaction(SIGUSR1, &quiet, nullptr);

  std::vector<char*> args;
  for (auto& a : fuse_args) args.push_back(a.data());
  return fuse_main(static_cast<int>(args.size()), args.data(), &ops, nullptr);
}

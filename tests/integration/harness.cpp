#include "integration/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

namespace gpurun::test {

namespace {
pid_t spawn(const std::vector<std::string>& argv, const std::string& out_path,
            const std::string& err_path, const Env& env) {
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = open("/dev/null", O_RDONLY);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

Result wait_for(pid_t pid, const std::string& out_path, const std::string& err_path,
                double timeout_seconds) {
  Result r;
  int status = 0;
  rusage usage{};
  const auto start = std::chrono::steady_clock::now();
  auto deadline = start + std::chrono::duration<double>(timeout_seconds);
  while (true) {
    pid_t done = wait4(pid, &status, WNOHANG, &usage);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      wait4(pid, &status, 0, &usage);
      ADD_FAILURE() << "process " << pid << " timed out after " << timeout_seconds << " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.max_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}
}  // namespace

pid_t start_gpurun(const std::vector<std::string>& args, const std::string& log_prefix,
                   const Env& env) {
  std::vector<std::string> argv{GPURUN_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  return spawn(argv, log_prefix + ".out", log_prefix + ".err", env);
}

namespace {
std::atomic<int> inexact_resume_expected{0};
}  // namespace

InexactResumeExpected::InexactResumeExpected() { ++inexact_resume_expected; }
InexactResumeExpected::~InexactResumeExpected() { --inexact_resume_expected; }

Result wait_gpurun(pid_t pid, const std::string& log_prefix, double timeout_seconds) {
  Result r = wait_for(pid, log_prefix + ".out", log_prefix + ".err", timeout_seconds);
  if (inexact_resume_expected == 0 && r.err.find("not bit-exact") != std::string::npos)
    ADD_FAILURE() << "a resume check found a resume that is not bit-exact:\n" << r.err;
  return r;
}

Result run_gpurun(const std::vector<std::string>& args, const Env& env, double timeout_seconds) {
  TempDir logs;
  pid_t pid = start_gpurun(args, logs / "gpurun", env);
  return wait_gpurun(pid, logs / "gpurun", timeout_seconds);
}

pid_t start_program(const std::vector<std::string>& argv, const std::string& log_prefix,
                    const Env& env) {
  return spawn(argv, log_prefix + ".out", log_prefix + ".err", env);
}

Result run_program(const std::vector<std::string>& argv, double timeout_seconds) {
  TempDir logs;
  pid_t pid = spawn(argv, logs / "out", logs / "err", {});
  return wait_for(pid, logs / "out", logs / "err", timeout_seconds);
}

std::string write_config(const TempDir& dir, const std::string& yaml, const std::string& name) {
  std::string path = dir / name;
  std::ofstream(path) << yaml;
  return path;
}

std::string small_config(int train, int batch, int epochs) {
  std::ostringstream y;
  y << "model: {name: mlp, hidden: [64]}\n"
    << "data: {name: idx, train_samples: " << train << ", eval_samples: 200}\n"
    << "optim: {name: sgd, lr: 0.05, momentum: 0.9}\n"
    << "train: {epochs: " << epochs << ", batch_size: " << batch
    << ", eval_batch_size: 200, seed: 7, threads: 1}\n"
    << "log: {every_steps: 1}\n";
  return y.str();
}

nlohmann::json inspect(const std::string& ckpt_dir) {
  Result r = run_gpurun({"ckpt", "inspect", ckpt_dir, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << r.out;
  return j;
}

std::vector<nlohmann::json> events(const std::string& run_dir, const std::string& event) {
  std::vector<nlohmann::json> out;
  std::istringstream lines(slurp(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == event) out.push_back(j);
  }
  return out;
}

size_t expect_exact_resume_checks(const std::string& run_dir) {
  size_t made = 0;
  for (const nlohmann::json& c : events(run_dir, "resume_check")) {
    if (!c.contains("exact")) continue;  // nothing compared, and why
    EXPECT_TRUE(c.value("exact", false)) << c.dump();
    ++made;
  }
  return made;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

void flip_byte(const std::string& path, int64_t offset, unsigned char mask) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << "cannot open " << path;
  f.seekg(offset);
  const int c = f.get();
  ASSERT_NE(c, EOF) << path << " has no byte " << offset;
  f.seekp(offset);
  f.put(static_cast<char>(c ^ mask));
  ASSERT_TRUE(f.flush()) << "cannot write " << path;
}

std::vector<std::string> with_sets(std::vector<std::string> args,
                                   const std::vector<std::string>& sets) {
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  return args;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

void sleep_for(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t resumed_step(const std::string& err) {
  // The first line of that form: others start alike ("resuming from the local tier ...").
  const std::string start = "resuming from ", key = ", global step ";
  for (size_t line = err.find(start); line != std::string::npos; line = err.find(start, line + 1)) {
    const size_t at = err.find(key, line);
    if (at != std::string::npos && at < err.find('\n', line))
      return std::stoll(err.substr(at + key.size()));
  }
  return -1;
}

bool has_exited(pid_t pid) {
  // WNOWAIT leaves the exit status for wait_gpurun.
  siginfo_t info{};
  return waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
         info.si_pid != 0;
}

bool wait_for_new_checkpoint(const std::string& ckpt_dir, pid_t pid, const std::string& before,
                             double timeout_seconds) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  // LATEST ends with a newline; a caller may pass its content trimmed or not.
  const std::string old_name = trimmed(before);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string latest = trimmed(slurp(ckpt_dir + "/LATEST"));
    if (!latest.empty() && latest != old_name) return true;
    if (pid > 0 && has_exited(pid)) return false;
    sleep_for(0.005);
  }
  return false;
}

int64_t newest_complete_step(const std::string& ckpt) {
  int64_t newest = -1;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(ckpt, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) != 0 || name.find('.') != std::string::npos) continue;
    newest = std::max<int64_t>(newest, std::stoll(name.substr(name.rfind("-s") + 2)));
  }
  return newest;
}

std::optional<nlohmann::json> wait_for_event(
    const std::string& run_dir, const std::string& event,
    const std::function<bool(const nlohmann::json&)>& accept, pid_t pid, double timeout_seconds) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  const std::string path = run_dir + "/metrics.jsonl";
  size_t read = 0;  // bytes of complete lines already looked at
  while (std::chrono::steady_clock::now() < deadline) {
    // Whether it exited, asked before the file is read: its last lines are then in it.
    const bool exited = pid > 0 && has_exited(pid);
    const std::string text = slurp(path);
    if (text.size() < read) read = 0;  // replaced: look again from the start
    for (size_t end; (end = text.find('\n', read)) != std::string::npos; read = end + 1) {
      auto j =
          nlohmann::json::parse(text.begin() + static_cast<std::ptrdiff_t>(read),
                                text.begin() + static_cast<std::ptrdiff_t>(end), nullptr, false);
      if (!j.is_discarded() && j.value("event", "") == event && (!accept || accept(j))) return j;
    }
    if (exited) return std::nullopt;
    sleep_for(0.005);
  }
  return std::nullopt;
}

std::optional<nlohmann::json> wait_for_step(const std::string& run_dir, int64_t global_step,
                                            pid_t pid, double timeout_seconds) {
  return wait_for_event(
      run_dir, "step",
      [global_step](const nlohmann::json& e) {
        return e.value("global_step", int64_t{-1}) >= global_step;
      },
      pid, timeout_seconds);
}

bool wait_for_write_in_flight(const std::string& dir, pid_t pid, double seconds) {
  namespace fs = std::filesystem;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    if (fs::exists(dir, ec)) {
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().filename().string().rfind(".tmp-ckpt", 0) == 0) return true;
    }
    if (has_exited(pid)) return false;
    sleep_for(0.005);
  }
  return false;
}

Tmpfs::Tmpfs(const std::string& size, bool read_only) {
  const std::string opts = "size=" + size;
  ok_ = mount("tmpfs", dir_.path().c_str(), "tmpfs", read_only ? MS_RDONLY : 0, opts.c_str()) == 0;
}

Tmpfs::~Tmpfs() {
  if (ok_) umount2(dir_.path().c_str(), MNT_DETACH);
}

bool Tmpfs::remount_read_only() {
  for (int i = 0; i < 2000; ++i) {
    if (mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) == 0)
      return true;
    if (errno != EBUSY) return false;
    usleep(5000);
  }
  return false;
}

bool Tmpfs::remount_writable() {
  return mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_REMOUNT, nullptr) == 0;
}

int sigkill_after_checkpoints(const std::vector<std::string>& args, const std::string& ckpt,
                              const std::string& log_prefix, int kills) {
  // 20 ms a step in the processes to be killed: the kill, at most 50 ms x kills after the
  // checkpoint, finds the run still training on any machine; the last process runs at full speed.
  const Env slow{{"GPURUN_FAULT", "sleep20:after_step:*"}};
  int killed = 0;
  for (int attempt = 0; attempt < kills + 10; ++attempt) {
    const std::string before = slurp(ckpt + "/LATEST");
    const pid_t pid = start_gpurun(args, log_prefix, killed < kills ? slow : Env{});
    if (killed < kills && wait_for_new_checkpoint(ckpt, pid, before)) {
      sleep_for(0.05 * killed);
      kill(pid, SIGKILL);
    }
    Result r = wait_gpurun(pid, log_prefix);
    if (r.exit_code == 0) break;
    EXPECT_EQ(r.signal, SIGKILL) << "exit " << r.exit_code << "\n" << r.err;
    if (r.signal != SIGKILL) break;
    ++killed;
  }
  return killed;
}

pid_t worker_pid(pid_t launcher, int rank) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream stat(slurp(e.path() / "stat"));
    std::string pid, comm, state;
    pid_t ppid = 0;
    stat >> pid >> comm >> state >> ppid;
    if (ppid != launcher) continue;
    const std::string env = slurp(e.path() / "environ");
    if (env.find(std::string("\0RANK=", 6) + std::to_string(rank) + '\0') != std::string::npos ||
        env.rfind("RANK=" + std::to_string(rank) + '\0', 0) == 0)
      return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

}  // namespace gpurun::test

#include "util/signals.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "gpurun/errors.h"

namespace gpurun {
namespace {
std::atomic<int> g_signal{0};
std::atomic<int> g_interrupts{0};
/// Write end of the pipe that wakes the immediate-stop thread; -1 until one is started.
std::atomic<int> g_wake_fd{-1};
std::mutex g_action_mutex;
std::function<void(int)> g_action;  ///< guarded by g_action_mutex
/// exit_at_first_signal()'s command name; null: stop at the next step boundary (a run).
std::atomic<const char*> g_exit_at_once{nullptr};

/// Only async-signal-safe calls: write(2) and _exit(2).
[[noreturn]] void exit_for(int sig, const char* command) {
  const char* parts[] = {"\ngpurun ", command, ": stopped by ",
                         sig == SIGINT ? "SIGINT" : "a signal", "; nothing was written\n"};
  for (const char* part : parts) {
    ssize_t ignored = write(STDERR_FILENO, part, std::strlen(part));
    (void)ignored;
  }
  _exit(sig == SIGINT ? 130 : kExitSignal);
}

void exit_now() {
  static const char msg[] = "\ngpurun: second interrupt, stopping now; run again with --resume\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
  _exit(kExitSignal);
}

void on_signal(int sig) {
  if (const char* command = g_exit_at_once.load()) exit_for(sig, command);
  if (sig == SIGINT) {
    const int earlier = g_interrupts.fetch_add(1);
    const int wake = g_wake_fd.load();
    // The second: wake the thread that records the stop (write(2) is async-signal-safe);
    // a third, or no such thread: out at once.
    if (earlier == 1 && wake >= 0) {
      const char byte = static_cast<char>(sig);
      if (write(wake, &byte, 1) == 1) return;
    }
    if (earlier >= 1) exit_now();
  }
  request_stop(sig);  // an atomic compare-exchange: async-signal-safe
}

void immediate_stop_loop(int read_fd) {
  for (;;) {
    char byte = 0;
    const ssize_t n = read(read_fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1) return;
    std::lock_guard<std::mutex> lock(g_action_mutex);
    if (!g_action) exit_now();
    try {
      g_action(static_cast<unsigned char>(byte));
    } catch (...) {
      // The stop goes on: exit 75 with what is recorded.
    }
    _exit(kExitSignal);
  }
}

void start_immediate_stop_thread() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  std::thread(immediate_stop_loop, fds[0]).detach();
  g_wake_fd.store(fds[1]);
}
}  // namespace

namespace {
sigset_t stop_set() noexcept {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kStopSignals) sigaddset(&set, sig);
  return set;
}
}  // namespace

void block_stop_signals() noexcept {
  const sigset_t set = stop_set();
  sigprocmask(SIG_BLOCK, &set, nullptr);
}

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a signal must not make a checkpoint write fail with EINTR
  // SIGHUP: a closed terminal or ssh session is the most common accidental stop.
  for (int sig : kStopSignals) sigaction(sig, &sa, nullptr);
  // A closed pipe on stdout/stderr (`gpurun ... | head`) must not kill a run mid-save.
  signal(SIGPIPE, SIG_IGN);
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

void add_stop_signal(int signal_number) {
  if (signal_number < 1 || signal_number >= NSIG || signal_number == SIGKILL ||
      signal_number == SIGSTOP || signal_number == SIGPIPE)
    throw std::invalid_argument("cannot stop on " + signal_name(signal_number));
  if (is_default_stop_signal(signal_number)) return;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(signal_number, &sa, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signal_number);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

bool is_default_stop_signal(int signal_number) noexcept {
  for (int sig : kStopSignals)
    if (sig == signal_number) return true;
  return false;
}

void exit_at_first_signal(const char* command) {
  g_exit_at_once.store(command);
  if (const int sig = g_signal.load()) exit_for(sig, command);
}

int stop_signal() noexcept { return g_signal.load(); }

void clear_stop_signal() noexcept {
  g_signal.store(0);
  g_interrupts.store(0);
}

void request_stop(int signal_number) noexcept {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, signal_number);
}

void set_immediate_stop_action(std::function<void(int)> action) {
  static std::once_flag started;
  if (action) std::call_once(started, start_immediate_stop_thread);
  std::lock_guard<std::mutex> lock(g_action_mutex);
  g_action = std::move(action);
}

std::string signal_name(int signal_number) {
  const char* abbrev = ::sigabbrev_np(signal_number);  // glibc >= 2.32; null when it has none
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal_number);
}

}  // namespace gpurun

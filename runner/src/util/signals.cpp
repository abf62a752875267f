#include "util/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

#include "gpurun/errors.h"

namespace gpurun {
namespace {
std::atomic<int> g_signal{0};
std::atomic<int> g_interrupts{0};

void on_signal(int sig) {
  if (sig == SIGINT && g_interrupts.fetch_add(1) >= 1) {
    static const char msg[] = "\ngpurun: second interrupt, stopping now\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    _exit(kExitSignal);
  }
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
}
}  // namespace

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a signal must not make a checkpoint write fail with EINTR
  // SIGHUP: a closed terminal or ssh session is the most common accidental stop.
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP}) sigaction(sig, &sa, nullptr);
  // A closed pipe on stdout/stderr (`gpurun ... | head`) must not kill a run mid-save.
  signal(SIGPIPE, SIG_IGN);
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

std::string signal_name(int signal_number) {
  const char* abbrev = ::sigabbrev_np(signal_number);  // glibc >= 2.32; null when it has none
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal_number);
}

}  // namespace gpurun

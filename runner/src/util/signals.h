// Stop requests by signal: SIGTERM (spot reclaim, `kill`), SIGINT (Ctrl-C), SIGUSR1 (Slurm's
// --signal=USR1@120 before the time limit), SIGUSR2, SIGHUP (a closed terminal or ssh
// session). SIGPIPE is ignored, so that a closed output pipe cannot kill a run mid-save.
//
// The handlers only record the signal; the trainer polls stop_signal() at every step boundary,
// writes a checkpoint and exits 75 (kExitSignal). A second SIGINT stops at once, without
// waiting for the step or a checkpoint (a save in flight leaves a .tmp- folder that the next
// run cleans; the last complete checkpoint is untouched): the immediate-stop action runs to
// record the stop, then the process exits 75. A third SIGINT exits 75 without waiting for it.
#pragma once

#include <csignal>
#include <functional>
#include <string>

namespace gpurun {

/// The signals that ask a run to stop.
inline constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP};

/// Blocks kStopSignals in the calling thread (sigprocmask only: safe before any initializer
/// has run). The gpurun binary calls it from its .preinit_array, before LibTorch's libraries
/// run their initializers (most of a second on a loaded machine), so that a signal in that
/// time waits, pending, for install_signal_handlers() instead of killing the process with
/// 128 + its number. Threads started by those initializers inherit the mask and never take
/// a stop signal.
void block_stop_signals() noexcept;

/// Installs the handlers, then unblocks kStopSignals (a signal that arrived while they were
/// blocked is delivered then, and recorded); call first thing in main(), before anything can
/// take time.
void install_signal_handlers();

/// Makes `signal_number` a stop signal too: a scheduler's warning signal outside kStopSignals
/// (`--slurm-signal URG`, a real-time signal). Its handler is installed now, so one that arrives
/// before this call still has its default action. Throws std::invalid_argument for SIGKILL,
/// SIGSTOP, SIGPIPE or a number out of 1..NSIG-1.
void add_stop_signal(int signal_number);

/// Whether `signal_number` is one of kStopSignals.
bool is_default_stop_signal(int signal_number) noexcept;

/// The first stop signal received since start (or the last clear), 0 when none.
int stop_signal() noexcept;

/// Forgets a received signal (tests).
void clear_stop_signal() noexcept;

/// Records a stop request as if `signal_number` had arrived (used by the fault hooks).
void request_stop(int signal_number) noexcept;

/// What a second SIGINT does before the process exits 75: `action` gets the signal number and
/// runs on a thread of its own (never inside the handler, so it may log and write files), while
/// the rest of the process goes on; it should only record the stop, quickly. An empty
/// `action` restores the plain exit (a message and exit 75). Waits for an action that is
/// running, so that an owner's destructor may clear it safely. Throws std::system_error when
/// the thread or its pipe cannot be created.
void set_immediate_stop_action(std::function<void(int signal_number)> action);

/// For commands that hold nothing to save (`gpurun plan`, `ckpt`, `status`): from now on the
/// first stop signal ends the process at once, printing "gpurun `command`: stopped by SIGINT;
/// nothing was written" and exiting 130 for SIGINT (the shell's convention for Ctrl-C) or 75
/// (kExitSignal) for the others. A signal that arrived before this call ends it the same way,
/// here. Children forked later inherit the handler.
void exit_at_first_signal(const char* command);

/// "SIGTERM" for a signal glibc has an abbreviation for (sigabbrev_np), else "signal 35"
/// (real-time signals, 0, numbers out of range).
std::string signal_name(int signal_number);

}  // namespace gpurun

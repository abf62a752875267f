// Unit tests of the error types' messages and exit codes (gpurun/errors.h).
#include <csignal>
#include <string>

#include <gtest/gtest.h>

#include "gpurun/errors.h"
#include "util/signals.h"

namespace gpurun {
namespace {

TEST(Stopped, NamesTheSignal) {
  const Stopped stopped(SIGTERM);
  EXPECT_STREQ(stopped.what(), "stopped by SIGTERM; run again with --resume");
  EXPECT_EQ(stopped.signal_number(), SIGTERM);
  EXPECT_EQ(exit_code_for(stopped), kExitSignal);
}

TEST(Stopped, ASignalWithoutAnAbbreviationIsNamedByNumber) {
  // glibc's sigabbrev_np() returns null for the real-time signals and for numbers out of range.
  const int realtime = SIGRTMIN + 1;
  ASSERT_EQ(sigabbrev_np(realtime), nullptr);
  EXPECT_EQ(Stopped(realtime).what(),
            "stopped by signal " + std::to_string(realtime) + "; run again with --resume");
  EXPECT_EQ(signal_name(1000), "signal 1000");
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
}

}  // namespace
}  // namespace gpurun

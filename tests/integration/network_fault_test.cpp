// Two nodes in two network namespaces (integration/netns.h), each with its own address and host
// name, train one DDP job through --nnodes/--node-rank/--master-addr while the test cuts the
// link between them or drops their packets with nftables (issue 15). Label `faults`: `ctest -L
// faults`. Each test skips, saying why, where network namespaces cannot be made.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "distributed/worker_env.h"
#include "integration/harness.h"
#include "integration/netns.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr double kTimeout = 6;  // distributed.timeout of these runs, seconds
// Each step sleeps 20 ms in the first run only (GPURUN_FAULT_RESTART defaults to 0), so that
// the test has time to cut the network mid-run and a restart is quick.
const Env kSlowSteps{{"GPURUN_FAULT", "sleep20:after_step:*"}};

std::vector<std::string> job_sets() {
  return {"checkpoint.every_steps=20", "distributed.timeout=" + std::to_string(kTimeout)};
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// One launcher per node, 1 rank each, rank 0's node the master.
struct Job {
  const TwoNodes& nodes;
  const TempDir& dir;
  std::vector<std::string> args;  // config, --ckpt and the like, shared by both
  pid_t pid[2] = {-1, -1};

  void start(const std::vector<std::string>& extra = {}) {
    const std::string port = std::to_string(gpurun::find_free_port());
    for (int n : {0, 1}) {
      std::vector<std::string> argv{GPURUN_BINARY};
      argv.insert(argv.end(), args.begin(), args.end());
      argv.insert(argv.end(),
                  {"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", std::to_string(n),
                   "--master-addr", TwoNodes::address(0), "--master-port", port});
      argv.insert(argv.end(), extra.begin(), extra.end());
      pid[n] = nodes.start(n, argv, log(n), kSlowSteps);
    }
  }
  std::string log(int n) const { return dir / ("node" + std::to_string(n)); }
  Result wait(int n, double seconds) { return wait_gpurun(pid[n], log(n), seconds); }
};

#define REQUIRE_TWO_NODES(nodes_)                       \
  do {                                                  \
    if (!(nodes_).ok()) GTEST_SKIP() << (nodes_).why(); \
  } while (0)

// The link goes down mid-run (a switch port, a cable, a reclaimed VM's NIC): neither side gets
// an error from the network, only silence. Both nodes end within the collective timeout plus
// the peer probe, non-zero, and each names the peer it lost, the step and what timed out.
TEST(Network, TwoNodesCutByALinkDownBothEndWithinTheTimeoutNamingThePeerAndTheStep) {
  TwoNodes nodes;
  REQUIRE_TWO_NODES(nodes);
  TempDir dir;
  const std::string config = write_config(dir, small_config(3200, 32, 2));
  Job job{nodes, dir, with_sets({config, "--ckpt", dir / "ckpt"}, job_sets())};
  job.start();
  ASSERT_TRUE(wait_for_new_checkpoint(dir / "ckpt", job.pid[0], "", 120))
      << slurp(job.log(0) + ".err");
  nodes.link_down(1);
  const auto cut = Clock::now();
  Result r0 = job.wait(0, 60), r1 = job.wait(1, 60);
  const double detected = seconds_since(cut);
  std::cout << "[ measured ] link down: both nodes ended " << detected << " s after the cut ("
            << "distributed.timeout " << kTimeout << " s)\n";
  EXPECT_EQ(r0.exit_code, 1) << r0.err;
  EXPECT_EQ(r1.exit_code, 1) << r1.err;
  // The timeout, the 2 s probe of the peers, the exit; slack for a loaded machine.
  EXPECT_LT(detected, kTimeout + 8) << r0.err;
  EXPECT_TRUE(contains(r0.err, "rank 0 on " + nodes.host(0) + ": all-reduce across 2 ranks"))
      << r0.err;
  EXPECT_TRUE(contains(r0.err, "during step")) << r0.err;
  EXPECT_TRUE(contains(r0.err, "imed out")) << r0.err;  // Gloo: "Timed out waiting ... recv"
  EXPECT_TRUE(contains(
      r0.err, "no answer from rank 1 on " + nodes.host(1) + " (" + TwoNodes::address(1) + ")"))
      << r0.err;
  EXPECT_TRUE(contains(r1.err, "no answer from rank 0 on " + nodes.host(0))) << r1.err;
  // What was complete before the cut is still complete.
  EXPECT_EQ(run_gpurun({"ckpt", "verify", dir / "ckpt"}).exit_code, 0);
}

// Packets dropped without a word (a firewall rule, a saturated or misrouted network): the job
// fails the same way, and with --max-restarts both launchers start their ranks again once the
// rule is gone; the job resumes from the last complete checkpoint and ends bit-identical to a
// run that was never interrupted.
TEST(Network, PacketsDroppedByNftablesAreSurvivedWithMaxRestartsToTheUninterruptedDigest) {
  TwoNodes nodes;
  REQUIRE_TWO_NODES(nodes);
  if (!nodes.has_nft()) GTEST_SKIP() << "nft (Debian's nftables) is not installed";
  TempDir dir;
  const std::string config = write_config(dir, small_config(3200, 32, 2));
  Result reference = run_gpurun(
      with_sets({config, "--ckpt", dir / "reference", "--nproc-per-node", "2"}, job_sets()));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;

  Job job{nodes, dir, with_sets({config, "--ckpt", dir / "ckpt"}, job_sets())};
  job.start({"--max-restarts", "2"});
  ASSERT_TRUE(wait_for_new_checkpoint(dir / "ckpt", job.pid[0], "", 120))
      << slurp(job.log(0) + ".err");
  nodes.drop_from_peer(1);
  const auto cut = Clock::now();
  while (!contains(slurp(job.log(0) + ".err"), "no answer from rank 1") && seconds_since(cut) < 60)
    sleep_for(0.05);
  const double detected = seconds_since(cut);
  nodes.undrop(1);
  std::cout << "[ measured ] nftables DROP: rank 0 named the silent peer " << detected
            << " s after the rule (distributed.timeout " << kTimeout << " s)\n";
  EXPECT_LT(detected, kTimeout + 6);
  Result r0 = job.wait(0, 180), r1 = job.wait(1, 180);
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  EXPECT_TRUE(contains(r0.err, "restart 1/2")) << r0.err;
  EXPECT_GE(events(dir / "ckpt", "resume").size(), 1u);
  EXPECT_EQ(inspect(dir / "ckpt").value("model_digest", "x"),
            inspect(dir / "reference").value("model_digest", "y"));
}

// One checkpoint directory shared by two machines (an NFS export): the lease of a live run on
// node 0 makes a run on node 1 wait and exit 2 naming the holder's host; once the holder is
// killed, node 1 cannot see its process, so it takes the lease over only when the heartbeat
// has gone stale, and resumes.
TEST(Network, ALeaseHeldOnOneHostIsHonouredFromAnotherAndTakenOverWhenItsHeartbeatStops) {
  TwoNodes nodes;
  REQUIRE_TWO_NODES(nodes);
  TempDir dir;
  const std::string config = write_config(dir, small_config(600, 30, 1));
  const std::vector<std::string> args{GPURUN_BINARY, config,  "--ckpt",
                                      dir / "ckpt",  "--set", "checkpoint.lease_timeout=2"};
  // The holder trains 50 epochs of 20 steps of 300 ms (train.epochs is not hashed: the third
  // run resumes it with one), so that it is alive until it is killed on any machine.
  std::vector<std::string> holder_args = args;
  holder_args.insert(holder_args.end(), {"--set", "train.epochs=50"});
  const pid_t holder =
      nodes.start(0, holder_args, dir / "holder", {{"GPURUN_FAULT", "sleep300:after_step:*"}});
  // Training, so that its lease is held: its first step's event, not a fixed wait.
  ASSERT_TRUE(wait_for_step(dir / "ckpt", 1, holder)) << slurp(dir / "holder.err");
  std::vector<std::string> second_args = args;
  second_args.push_back("--resume");
  const auto t0 = Clock::now();
  Result second = wait_gpurun(nodes.start(1, second_args, dir / "second"), dir / "second", 60);
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_GE(seconds_since(t0), 1.9);
  EXPECT_TRUE(contains(second.err, nodes.host(0))) << second.err;

  kill(holder, SIGKILL);
  EXPECT_EQ(wait_gpurun(holder, dir / "holder", 10).signal, SIGKILL);  // killed while training
  const auto t1 = Clock::now();
  Result third = wait_gpurun(nodes.start(1, second_args, dir / "third"), dir / "third", 120);
  EXPECT_EQ(third.exit_code, 0) << third.err;
  EXPECT_TRUE(contains(third.err, "heartbeat is")) << third.err;
  EXPECT_LT(seconds_since(t1), 60.0);
  EXPECT_EQ(inspect(dir / "ckpt").value("global_step", 0), 20);
}

}  // namespace
}  // namespace gpurun::test

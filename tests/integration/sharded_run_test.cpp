// The sharded optimizer through the real binary (distributed.shard: optimizer, 2-4 ranks over
// Gloo): SIGKILL of random ranks at random moments resumes to the uninterrupted sharded run's
// digest, a resume at another world size reshards and goes on, and the sharded run trains what
// DDP trains.
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "integration/harness.h"
#include "integration/weights.h"

using namespace gpurun::test;

namespace {

std::string digest(const std::string& ckpt) { return inspect(ckpt).value("model_digest", ""); }

/// Global batch 48 (divisible by 1 to 4 ranks), dropout (each rank's stream is state too),
/// AdamW (moments to shard), a checkpoint every 5 steps; 20 steps an epoch, 2 epochs.
std::string sharded_config(const TempDir& dir) {
  return write_config(dir,
                      "model: {name: mlp, hidden: [96], dropout: 0.1}\n"
                      "data: {name: idx, train_samples: 960, eval_samples: 200}\n"
                      "optim: {name: adamw, lr: 0.002, weight_decay: 0.05}\n"
                      "train: {epochs: 2, batch_size: 48, seed: 5, threads: 1}\n"
                      "checkpoint: {every_steps: 5}\n"
                      "memory: {probe_steps: 1}\n"
                      "log: {every_steps: 5}\n");
}

std::vector<std::string> ranks(std::vector<std::string> args, int n,
                               const std::string& shard = "optimizer") {
  args.insert(args.end(),
              {"--nproc-per-node", std::to_string(n), "--set", "distributed.shard=" + shard});
  return args;
}

double last_eval_loss(const std::string& run_dir) {
  const auto epochs = events(run_dir, "epoch");
  return epochs.empty() ? -1 : epochs.back().value("eval_loss", -1.0);
}

}  // namespace

// Issue 29: SIGKILL of a random rank at a random moment after a checkpoint (in a step, or
// during the next save's shard writes), three times; each restart resumes the newest complete
// checkpoint and the last one ends with the digest of the uninterrupted sharded run. In the
// rounds meant to be killed, each step takes 80 ms more and a process pauses after its second
// save, so a test process scheduled late still finds its victim alive rather than a finished
// run, and every round starts at step 20 or before, with two saves still ahead of it.
TEST(Sharded, RandomSigkillsOnRandomRanksEndWithTheUninterruptedShardedDigest) {
  TempDir dir;
  const std::string config = sharded_config(dir);
  Result reference = run_gpurun(ranks({config, "--ckpt", dir / "reference"}, 2));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const std::string ckpt = dir / "killed";
  std::mt19937 random(29);
  int kills = 0;
  for (int round = 0; round < 4; ++round) {
    std::vector<std::string> args = ranks({config, "--ckpt", ckpt}, 2);
    if (round > 0) args.push_back("--resume");
    const std::string before = round > 0 ? slurp(ckpt + "/LATEST") : "";
    const Env slowed{{"GPURUN_FAULT", "sleep80:after_step:*,sleep300000:after_save:2"}};
    const pid_t launcher =
        start_gpurun(args, dir / ("run" + std::to_string(round)), round < 3 ? slowed : Env{});
    if (round < 3) {
      ASSERT_TRUE(wait_for_new_checkpoint(ckpt, launcher, before, 120))
          << "round " << round << "\n"
          << slurp(dir / ("run" + std::to_string(round) + ".err"));
      sleep_for(std::uniform_real_distribution<double>(0, 0.3)(random));
      const pid_t victim = worker_pid(launcher, static_cast<int>(random() % 2));
      ASSERT_GT(victim, 0) << "no rank to kill in round " << round;
      ASSERT_EQ(kill(victim, SIGKILL), 0);
      ++kills;
    }
    const Result r = wait_gpurun(launcher, dir / ("run" + std::to_string(round)), 180);
    if (r.exit_code == 0) break;
    ASSERT_EQ(r.exit_code, 1) << r.err;  // a rank killed: the job fails, naming it
  }
  EXPECT_EQ(kills, 3);
  EXPECT_EQ(digest(ckpt), digest(dir / "reference"));
  EXPECT_EQ(inspect(ckpt).value("global_step", -1), 40);
}

// Issue 29: stopped after step 20 and resumed at another world size (2->3, 3->2, 4->1, 1->2):
// each rank reads the element ranges it now owns, the run goes on to the end, and it learns
// what the run that kept its world size learned. Without dropout (whose streams are new on new
// ranks) the only difference is the order in which the gradients are summed, over another
// number of ranks: the weights end within 1e-3 relative of the kept run's, which a shard read
// at a wrong offset would miss by far more.
TEST(Sharded, ResumeAtAnotherWorldSizeReshardsAndGoesOn) {
  TempDir dir;
  const std::string config = sharded_config(dir);
  const auto ranks = [](std::vector<std::string> args, int n) {
    args = ::ranks(std::move(args), n);
    args.insert(args.end(), {"--set", "model.dropout=0"});
    return args;
  };
  std::map<int, std::string> kept;
  for (const auto& [first, second] :
       {std::pair{2, 3}, std::pair{3, 2}, std::pair{4, 1}, std::pair{1, 2}}) {
    const std::string name = std::to_string(first) + "to" + std::to_string(second);
    if (!kept.count(first)) {
      kept[first] = dir / ("kept" + std::to_string(first));
      Result r = run_gpurun(ranks({config, "--ckpt", kept[first]}, first));
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    const std::string ckpt = dir / name;
    Result stopped = run_gpurun(ranks({config, "--ckpt", ckpt}, first),
                                {{"GPURUN_FAULT", "sigterm:after_step:20"}});
    ASSERT_EQ(stopped.exit_code, 75) << name << "\n" << stopped.err;
    Result resumed = run_gpurun(ranks({config, "--ckpt", ckpt, "--resume"}, second));
    ASSERT_EQ(resumed.exit_code, 0) << name << "\n" << resumed.err;
    EXPECT_TRUE(contains(resumed.err, "global step 20")) << resumed.err;
    EXPECT_EQ(inspect(ckpt).value("global_step", -1), 40) << name;
    const double loss = last_eval_loss(ckpt), reference = last_eval_loss(kept[first]);
    EXPECT_NEAR(loss, reference, 1e-3 * reference) << name;
    EXPECT_LT(relative_norm_difference(newest_weights(ckpt), newest_weights(kept[first])), 1e-3)
        << name;
  }
}

// Issue 29: a sharded run trains what DDP trains at the same world size, including 3 ranks
// over a parameter count (76 330) that 3 does not divide. Not bit for bit: the update is ATen's
// fused AdamW over the slice against LibTorch's per-parameter AdamW, and the sum a
// reduce-scatter against an all-reduce, each rounding in its own order; after 40 steps the
// weights agree within 1e-4 relative. The bytes moved per step are DDP's (padding aside).
TEST(Sharded, TrainsWhatDdpTrainsAndMovesTheSameBytes) {
  TempDir dir;
  const std::string config = sharded_config(dir);
  for (const int n : {2, 3}) {
    const std::string ddp = dir / ("ddp" + std::to_string(n));
    const std::string sharded = dir / ("sharded" + std::to_string(n));
    Result a = run_gpurun(ranks({config, "--ckpt", ddp}, n, "none"));
    ASSERT_EQ(a.exit_code, 0) << a.err;
    Result b = run_gpurun(ranks({config, "--ckpt", sharded}, n));
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_TRUE(contains(b.err, "optimizer: sharded (optimizer) over " + std::to_string(n)))
        << b.err;
    EXPECT_LT(relative_norm_difference(newest_weights(sharded), newest_weights(ddp)), 1e-4)
        << n << " ranks";
    const auto moved = [](const std::string& run) {
      return events(run, "step").back().value("moved_bytes_per_step", 0.0);
    };
    EXPECT_GT(moved(ddp), 0);
    EXPECT_NEAR(moved(sharded) / moved(ddp), 1.0, 0.02) << n << " ranks";
    // The shard files: one per rank, listed and verified like any file.
    Result verify = run_gpurun({"ckpt", "verify", sharded});
    EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  }
}

// Issue 29: a run whose state fits no card replicated (AdamW, an MLP of 1.86 M parameters:
// 36.4 MiB a rank by the estimate, against 31.5 MiB usable under a 35 MiB limit) is refused
// replicated (exit 2, before anything is built), and distributed.shard auto shards it over 4
// ranks (the mode that fits, said in the log) and trains it to the end under that limit.
TEST(Sharded, AutoShardsARunThatFitsNoOtherWayUnderAMemoryLimit) {
  TempDir dir;
  const std::string config =
      write_config(dir,
                   "model: {name: mlp, hidden: [1024, 1024]}\n"
                   "data: {name: idx, train_samples: 480, eval_samples: 100}\n"
                   "optim: {name: adamw, lr: 0.001}\n"
                   "train: {epochs: 1, batch_size: 48, threads: 1, "
                   "eval_batch_size: 50}\n"
                   "memory: {probe_steps: 1}\n");
  Result replicated =
      run_gpurun(ranks({config, "--ckpt", dir / "none", "--memory-limit", "35MiB"}, 4, "none"));
  EXPECT_EQ(replicated.exit_code, 2) << replicated.err;
  EXPECT_TRUE(contains(replicated.err, "does not fit")) << replicated.err;
  Result sharded =
      run_gpurun(ranks({config, "--ckpt", dir / "auto", "--memory-limit", "35MiB"}, 4, "auto"));
  ASSERT_EQ(sharded.exit_code, 0) << sharded.err;
  // The first sharded mode that fits by the estimate (optimizer: 30.2 MiB a rank), and why.
  EXPECT_TRUE(
      contains(sharded.err, "optimizer placement: optimizer over 4 ranks (replicated needs"))
      << sharded.err;
  EXPECT_EQ(inspect(dir / "auto").value("global_step", -1), 10);
  // The measured peak of every part stays under the limit.
  for (const auto& epoch : events(dir / "auto", "epoch"))
    EXPECT_LE(epoch.value("peak_bytes", int64_t{0}), int64_t{35} << 20);
}

// Issue 29: on the gpt, each rank's measured training-step peak matches the estimate of the
// same placement within 10% for 1, 2 and 4 ranks sharded (1 rank: replicated, as the info line
// says), both the planner's probe of one step (the plan event's measured_peaks.training) and
// the run's own steps (the epoch event's), and falls as the ranks grow. The estimate counts a
// training step; the checkpoint buffers kept between saves are measured apart. Context 128
// makes the backward pass the peak at every N, the part of a step the estimate counts most
// closely on a model this small.
TEST(Sharded, EachRanksPeakOnTheGptMatchesTheEstimateWithinTenPercent) {
  TempDir dir;
  const std::string config =
      write_config(dir,
                   "model: {name: gpt, layers: 2, width: 128, heads: 4}\n"
                   "data: {name: text, path: /usr/local/share/gpurun/kjv.txt, context: 128, "
                   "train_samples: 96, eval_samples: 16}\n"
                   "optim: {name: adamw, lr: 0.001}\n"
                   "train: {epochs: 1, batch_size: 16, threads: 1, eval_batch_size: 16}\n"
                   "memory: {probe_steps: 1}\n");
  double previous = 0;
  for (const int n : {1, 2, 4}) {
    const std::string run = dir / ("n" + std::to_string(n));
    Result r = run_gpurun(ranks({config, "--ckpt", run}, n));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto plans = events(run, "plan");
    const auto epochs = events(run, "epoch");
    ASSERT_FALSE(plans.empty() || epochs.empty()) << slurp(run + "/metrics.jsonl");
    const double estimated = plans.front().value("estimated_peak_bytes", 0.0);
    const double probed = plans.front()["measured_peaks"].value("training", 0.0);
    const double trained = epochs.front()["measured_peaks"].value("training", 0.0);
    ASSERT_GT(probed, 0) << plans.front().dump();
    ASSERT_GT(trained, 0) << epochs.front().dump();
    for (const double measured : {probed, trained})
      EXPECT_LT(std::abs(estimated - measured) / measured, 0.10)
          << n << " ranks: estimated " << estimated << " bytes; measured " << probed
          << " by the probe, " << trained << " in training";
    if (previous > 0) {
      EXPECT_LT(trained, previous) << n << " ranks";
    }
    previous = trained;
  }
}

// Unit tests of collectives.h over a real Gloo process group on 127.0.0.1, two ranks as two
// threads of this process: docs/architecture.md, case 6 (one all-reduce per optimizer step, not per
// micro-batch) and 12 (activation checkpointing under DDP), plus the small collectives.

#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <thread>

#include <gtest/gtest.h>

#include "unit/norms.h"

#include "distributed/collectives.h"
#include "gpurun/dataset.h"
#include "gpurun/model.h"
#include "model/micro_batch_step.h"

namespace gpurun {
namespace {

/// Rank `rank` of a 2-rank job on 127.0.0.1:`port`.
DistEnv rank_env(int rank, int port) {
  DistEnv env;
  env.rank = env.local_rank = rank;
  env.world_size = env.local_world_size = 2;
  env.master_port = port;
  return env;
}

/// Three Linear+ReLU segments and a head: no dropout or BatchNorm (docs/architecture.md, case 6,
/// 12).
std::shared_ptr<SegmentedModel> mlp(bool checkpointing) {
  torch::manual_seed(11);
  auto m = std::make_shared<SegmentedModel>();
  m->add_segment("a", torch::nn::Sequential(torch::nn::Linear(20, 32), torch::nn::ReLU()));
  m->add_segment("b", torch::nn::Sequential(torch::nn::Linear(32, 32), torch::nn::ReLU()));
  m->add_segment("c", torch::nn::Sequential(torch::nn::Linear(32, 5)));
  if (checkpointing) m->set_checkpointed({true, true, true});
  return m;
}

using test::relative_norm_difference;

at::Tensor flat_grads(const torch::nn::Module& model) {
  std::vector<at::Tensor> parts;
  for (const auto& p : model.parameters()) parts.push_back(p.grad().reshape(-1).clone());
  return at::cat(parts);
}

constexpr int64_t kGlobal = 32, kMicro = 4, kSteps = 2;  // accumulation 4 on each of 2 ranks

struct RankRun {
  std::vector<at::Tensor> grads;  // after each step's sync
  CollectiveStats stats;
  std::string error;
};

/// One rank: kSteps SGD steps of global batch kGlobal, its shard in micro-batches of kMicro.
void train_rank(int rank, int port, std::shared_ptr<SegmentedModel> model, const Dataset& data,
                RankRun& out) {
  try {
    auto comm = Collectives::connect(rank_env(rank, port), c10::kCPU, 60);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    const at::Tensor order = epoch_permutation(data.size(), 5, 0);
    const CollectiveStats before = comm->stats();
    for (int64_t step = 0; step < kSteps; ++step) {
      sgd.zero_grad();
      const at::Tensor window = order.narrow(0, step * kGlobal, kGlobal);
      const at::Tensor shard = window.slice(0, rank, kGlobal, 2).contiguous();
      accumulate_gradients(*model, data, shard, kMicro, c10::kCPU, kGlobal);
      std::vector<double> control{1.0};
      comm->sync_gradients(model->parameters(), control);
      EXPECT_EQ(control[0], 2.0);  // control values are summed with the gradients
      out.grads.push_back(flat_grads(*model));
      sgd.step();
    }
    out.stats = comm->stats();
    out.stats.gradient_syncs -= before.gradient_syncs;
    out.stats.all_reduce_calls -= before.all_reduce_calls;
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

/// The same steps in one process on the whole window.
std::vector<at::Tensor> train_single(std::shared_ptr<SegmentedModel> model, const Dataset& data) {
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  const at::Tensor order = epoch_permutation(data.size(), 5, 0);
  std::vector<at::Tensor> grads;
  for (int64_t step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    accumulate_gradients(*model, data, order.narrow(0, step * kGlobal, kGlobal), kGlobal,
                         c10::kCPU);
    grads.push_back(flat_grads(*model));
    sgd.step();
  }
  return grads;
}

void expect_ddp_equals_one_process(bool checkpointing) {
  torch::manual_seed(3);
  TensorDataset data(torch::randn({64, 20}), torch::randint(5, {64}));
  const std::vector<at::Tensor> expected = train_single(mlp(false), data);
  auto m0 = mlp(checkpointing), m1 = mlp(checkpointing);
  RankRun r0, r1;
  const int port = find_free_port();
  std::thread t0(train_rank, 0, port, m0, std::cref(data), std::ref(r0));
  std::thread t1(train_rank, 1, port, m1, std::cref(data), std::ref(r1));
  t0.join();
  t1.join();
  ASSERT_EQ(r0.error, "");
  ASSERT_EQ(r1.error, "");
  // 8 micro-batches per rank, accumulation 4: exactly 2 all-reduce rounds (one bucket each).
  EXPECT_EQ(r0.stats.gradient_syncs, 2);
  EXPECT_EQ(r0.stats.all_reduce_calls, 2);
  EXPECT_EQ(r1.stats.all_reduce_calls, 2);
  for (int64_t s = 0; s < kSteps; ++s) {
    EXPECT_TRUE(r0.grads[s].equal(r1.grads[s])) << "step " << s << ": ranks differ";
    EXPECT_LT(relative_norm_difference(r0.grads[s], expected[s]), 1e-5) << "step " << s;
  }
}

TEST(Collectives, Case6OneAllReducePerOptimizerStepAndGradientsOfTheCombinedBatch) {
  expect_ddp_equals_one_process(false);
}

TEST(Collectives, Case12ActivationCheckpointingUnderDdpGivesTheSameGradients) {
  expect_ddp_equals_one_process(true);
}

TEST(Collectives, BroadcastGatherAllReduceAndBarrier) {
  const int port = find_free_port();
  std::vector<std::string> gathered;
  std::string received, error0, error1;
  std::vector<double> max1, sum0;
  at::Tensor t0 = torch::full({3}, 7.0), t1 = torch::zeros({3});
  auto body = [&](int rank, std::string& error) {
    try {
      auto comm = Collectives::connect(rank_env(rank, port), c10::kCPU, 60);
      const std::string b = comm->broadcast(rank == 0 ? "ckpt-e0001-s0000010" : "ignored");
      if (rank == 1) received = b;
      auto g = comm->gather("state of rank " + std::to_string(rank));
      if (rank == 0) gathered = g;
      auto mx = comm->all_reduce({double(rank), 5.0 - rank}, Collectives::Op::kMax);
      auto sm = comm->all_reduce({1.5}, Collectives::Op::kSum);
      if (rank == 1) max1 = mx;
      if (rank == 0) sum0 = sm;
      comm->broadcast_tensors({rank == 0 ? t0 : t1});
      comm->barrier();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  std::thread a(body, 0, std::ref(error0)), b(body, 1, std::ref(error1));
  a.join();
  b.join();
  ASSERT_EQ(error0, "");
  ASSERT_EQ(error1, "");
  EXPECT_EQ(received, "ckpt-e0001-s0000010");
  EXPECT_EQ(gathered, (std::vector<std::string>{"state of rank 0", "state of rank 1"}));
  EXPECT_EQ(max1, (std::vector<double>{1.0, 5.0}));
  EXPECT_EQ(sum0, (std::vector<double>{3.0}));
  EXPECT_TRUE(t1.equal(t0));
}

// The reduce-scatter over Gloo (a ring of send/recv) at 2, 3 and 4 ranks, three calls in a row
// of chunks of odd widths: rank r gets chunk r summed over every rank (integer-valued floats, so
// the sum is exact whatever its order), the input is left as it was (it may be the gradient
// buffer itself), and the moved bytes are the ring model's (N - 1)/N of each input.
TEST(Collectives, ReduceScatterGivesEachRankItsChunkSummedOverEveryRank) {
  for (const int world : {2, 3, 4}) {
    const int port = find_free_port();
    std::vector<std::string> errors(static_cast<size_t>(world));
    auto body = [&](int rank) {
      try {
        DistEnv env = rank_env(rank, port);
        env.world_size = env.local_world_size = world;
        auto comm = Collectives::connect(env, c10::kCPU, 60);
        for (const int64_t w : {int64_t{1}, int64_t{1001}, int64_t{65536 + 3}}) {
          // rank q's input element i: (q + 1) * 1000 + i mod 997
          const at::Tensor index = torch::arange(world * w, torch::kFloat);
          const at::Tensor input = (rank + 1) * 1000.0 + torch::fmod(index, 997.0);
          const at::Tensor before = input.clone();
          at::Tensor output = torch::full({w}, -1.0);
          comm->reduce_scatter(input, output);
          const double ranks_sum = world * (world + 1) / 2 * 1000.0;
          const at::Tensor mine = index.narrow(0, rank * w, w);
          const at::Tensor expected = ranks_sum + world * torch::fmod(mine, 997.0);
          if (!output.equal(expected))
            throw std::runtime_error("wrong sum at width " + std::to_string(w));
          if (!input.equal(before)) throw std::runtime_error("the input was written");
        }
        const int64_t inputs = 4 * world * (1 + 1001 + 65536 + 3);
        const int64_t moved = comm->stats().moved_bytes(world);
        if (moved != static_cast<int64_t>(static_cast<double>(world - 1) / world * inputs))
          throw std::runtime_error("moved " + std::to_string(moved) + " bytes");
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    };
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r)
      EXPECT_EQ(errors[static_cast<size_t>(r)], "") << world << " ranks, rank " << r;
  }
}

TEST(Collectives, RendezvousWithoutPeersFailsNamingTheAddress) {
  DistEnv env;
  env.rank = 1;
  env.world_size = 2;
  env.master_port = find_free_port();  // nobody listens there
  try {
    Collectives::connect(env, c10::kCPU, 1.0);
    FAIL() << "connected to nobody";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(env.master_port)),
              std::string::npos)
        << e.what();
  }
}

TEST(Collectives, NcclOneRankAllReducesAndBroadcasts_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  DistEnv env;
  env.world_size = env.local_world_size = 1;
  env.master_port = find_free_port();
  auto comm = Collectives::connect(env, c10::Device(c10::kCUDA, 0), 60);
  auto model = mlp(false);
  model->to(c10::Device(c10::kCUDA, 0));
  for (auto& p : model->parameters()) p.mutable_grad() = at::ones_like(p);
  std::vector<double> control{2.5, 1.0};
  comm->sync_gradients(model->parameters(), control);
  EXPECT_EQ(control, (std::vector<double>{2.5, 1.0}));  // a sum over one rank
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(p.grad().is_cuda());
    EXPECT_TRUE(p.grad().equal(at::ones_like(p))) << "gradient changed by a 1-rank all-reduce";
  }
  comm->broadcast_tensors(model->parameters());
  EXPECT_EQ(comm->all_reduce({3.0}, Collectives::Op::kMax), (std::vector<double>{3.0}));
  EXPECT_EQ(comm->stats().gradient_syncs, 1);
}

}  // namespace
}  // namespace gpurun

// The loader (data/loader.h): batches in order whatever the workers' timing, at most `prefetch`
// fetched ahead, a data set's exception named by its sample, a stop that ends a wait, and a
// loader destroyed mid-pass that joins its workers; the requests of an epoch and the rule of
// `data.workers: auto`; the two keys in run.yaml.
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/stack.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "gpurun/config.h"
#include "gpurun/errors.h"

namespace gpurun {
namespace {

using Clock = std::chrono::steady_clock;

/// Sample i is the row [i, epoch, position]; a fetch sleeps a pseudo-random 0-3 ms (so that
/// workers finish out of order) and throws on `bad` when it is set.
class Probe : public Dataset {
 public:
  explicit Probe(int64_t n, int64_t bad = -1) : n_(n), bad_(bad) {}
  int64_t size() const override { return n_; }
  Batch get(const at::Tensor& indices) const override {
    return get_batch(indices, BatchContext{0, -1, indices});
  }
  Batch get_batch(const at::Tensor& indices, const BatchContext& context) const override {
    ++calls_;
    std::this_thread::sleep_for(std::chrono::milliseconds((indices[0].item<int64_t>() * 7) % 4));
    if (bad_ >= 0 && indices.eq(bad_).any().item<bool>())
      throw std::runtime_error("cannot read /data/part-3.bin");
    const at::Tensor epoch = at::full_like(indices, context.epoch);
    return {at::stack({indices, epoch, context.positions}, 1), indices};
  }
  int64_t calls() const { return calls_; }

 private:
  int64_t n_, bad_;
  mutable std::atomic<int64_t> calls_{0};
};

TEST(Loader, EpochRequestsWalkEachRanksShardFromThePosition) {
  const at::Tensor order = at::arange(99, -1, -1, at::kLong);  // 99, 98, ..., 0
  // From position 20, windows of 16, micro-batches of 3, rank 1 of 2: per window 8 samples in
  // chunks 3, 3, 2; the last window has 80 % 16 = 0 left over: 5 windows.
  const auto requests = epoch_requests(order, 20, 16, 3, 1, 2, 5, 2);
  ASSERT_EQ(requests.size(), 15u);
  std::vector<at::Tensor> indices, positions;
  for (const auto& r : requests) {
    EXPECT_EQ(r.context.seed, 5);
    EXPECT_EQ(r.context.epoch, 2);
    indices.push_back(r.indices);
    positions.push_back(r.context.positions);
  }
  const at::Tensor expected_positions = at::arange(21, 100, 2, at::kLong);
  EXPECT_TRUE(at::equal(at::cat(positions), expected_positions));
  EXPECT_TRUE(at::equal(at::cat(indices), order.index_select(0, expected_positions)));
  EXPECT_EQ(requests[2].indices.numel(), 2);
  // A short last window: 10 samples from position 90 in windows of 16.
  const auto tail = epoch_requests(order, 90, 16, 4, 0, 1, 5, 2);
  ASSERT_EQ(tail.size(), 3u);
  EXPECT_EQ(tail[2].indices.numel(), 2);
}

// The requests are made when asked for (an epoch of a large token file has millions): each
// equals the window-by-window cut of the epoch, for every rank, world, micro-batch and
// position, short last windows and ranks past a short window's end included.
TEST(Loader, EpochRequestsAreTheWindowsCutOneByOneWhateverTheShape) {
  const at::Tensor order = at::randperm(103, at::kLong);
  for (const int world : {1, 2, 3, 5})
    for (int rank = 0; rank < world; ++rank)
      for (const int64_t global : {1, 4, 7, 16})
        for (const int64_t micro : {1, 3, 16})
          for (const int64_t position : {0, 5, 100, 103}) {
            std::vector<at::Tensor> expected;
            for (int64_t p = position; p < 103; p += global) {
              const int64_t w = std::min<int64_t>(global, 103 - p);
              const at::Tensor shard = rank_shard(order.narrow(0, p, w), rank, world);
              for (int64_t s = 0; s < shard.numel(); s += micro)
                expected.push_back(shard.narrow(0, s, std::min(micro, shard.numel() - s)));
            }
            const BatchRequests requests =
                epoch_requests(order, position, global, micro, rank, world, 7, 1);
            ASSERT_EQ(requests.size(), expected.size())
                << rank << "/" << world << " " << global << " " << micro << " " << position;
            for (size_t k = 0; k < expected.size(); ++k) {
              const BatchRequest r = requests[static_cast<int64_t>(k)];
              ASSERT_TRUE(at::equal(r.indices, expected[k])) << k;
              // The positions of those samples in the epoch's permutation.
              for (int64_t i = 0; i < r.indices.numel(); ++i)
                ASSERT_EQ(order[r.context.positions[i].item<int64_t>()].item<int64_t>(),
                          r.indices[i].item<int64_t>());
            }
          }
  EXPECT_THROW(epoch_requests(order, 0, 16, 4, 0, 1, 0, 0)[26], std::out_of_range);
  EXPECT_THROW(epoch_requests(order, 0, 0, 4, 0, 1, 0, 0), std::invalid_argument);
}

TEST(Loader, AutoWorkersAreTheCoresLeftBesideTrainingBetween1And4) {
  EXPECT_EQ(resolve_workers(3, false, 2, 2), 3);
  EXPECT_EQ(resolve_workers(0, true, 64, 1), 0);
  EXPECT_EQ(resolve_workers(kAutoCount, false, 2, 2), 1);  // nothing left: still one
  EXPECT_EQ(resolve_workers(kAutoCount, false, 8, 5), 3);
  EXPECT_EQ(resolve_workers(kAutoCount, false, 64, 8), 4);
  EXPECT_EQ(resolve_workers(kAutoCount, true, 6, 6), 3);  // a GPU run: half the cores
  EXPECT_EQ(resolve_workers(kAutoCount, true, 16, 16), 4);
  EXPECT_EQ(resolve_prefetch(kAutoCount, 3), 6);
  EXPECT_EQ(resolve_prefetch(kAutoCount, 0), 2);
  EXPECT_EQ(resolve_prefetch(5, 3), 5);
}

TEST(Loader, BatchesArriveInOrderWithTheirContextWhateverTheWorkers) {
  Probe data(200);
  const at::Tensor order = at::arange(200, at::kLong).flip(0);
  const auto requests = epoch_requests(order, 0, 16, 5, 0, 1, 1, 3);
  for (int64_t workers : {0, 1, 4}) {
    BatchLoader loader(data, requests, {workers, 3, c10::kCPU, {}});
    for (const auto& r : requests) {
      const Batch b = loader.next(r.indices);
      ASSERT_TRUE(at::equal(b.targets, r.indices)) << "workers " << workers;
      ASSERT_TRUE(at::equal(b.inputs.select(1, 2), r.context.positions));
      ASSERT_EQ(b.inputs[0][1].item<int64_t>(), 3);
    }
    EXPECT_EQ(loader.remaining(), 0);
    EXPECT_THROW(loader.next(requests[0].indices), std::logic_error);
  }
  // Other indices than the request's are a bug of the caller.
  BatchLoader loader(data, requests, {2, 2, c10::kCPU, {}});
  EXPECT_THROW(loader.next(requests[1].indices), std::logic_error);
}

TEST(Loader, AtMostPrefetchBatchesAreFetchedAhead) {
  Probe data(400);
  const auto requests = epoch_requests(at::arange(400, at::kLong), 0, 10, 10, 0, 1, 0, 0);
  BatchLoader loader(data, requests, {4, 3, c10::kCPU, {}});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(data.calls(), 3);  // the workers wait for room
  for (int i = 0; i < 20; ++i) loader.next(requests[i].indices);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(data.calls(), 23);
}

TEST(Loader, ADataSetsExceptionNamesTheSampleAndComesInOrder) {
  Probe data(100, 37);
  const at::Tensor order = at::arange(100, at::kLong);
  const auto requests = epoch_requests(order, 0, 10, 10, 0, 1, 0, 1);
  for (int64_t workers : {0, 2}) {
    BatchLoader loader(data, requests, {workers, 4, c10::kCPU, {}});
    // The batches before the bad one come as they are.
    for (int i = 0; i < 3; ++i) EXPECT_NO_THROW(loader.next(requests[i].indices));
    try {
      loader.next(requests[3].indices);
      FAIL() << "no error for the batch of sample 37";
    } catch (const DataFailed& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("the data set failed on sample 37 (epoch 1, position 37"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("cannot read /data/part-3.bin"), std::string::npos) << what;
      EXPECT_EQ(exit_code_for(e), 1);
    }
  }
}

TEST(Loader, AStopEndsAnInterruptibleWaitAndDestructionJoinsBusyWorkers) {
  /// Every fetch takes 1 s: far longer than the stop's 50 ms and 20 ms poll, on any machine.
  class Slow : public Dataset {
   public:
    int64_t size() const override { return 100; }
    Batch get(const at::Tensor& indices) const override {
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      return {indices.to(at::kFloat), indices};
    }
  } data;
  const auto requests = epoch_requests(at::arange(100, at::kLong), 0, 4, 4, 0, 1, 0, 0);
  std::atomic<bool> stop{false};
  auto loader = std::make_unique<BatchLoader>(
      data, requests, BatchLoader::Options{2, 4, c10::kCPU, [&] { return stop.load(); }});
  std::thread signaller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stop = true;
  });
  const auto start = Clock::now();
  EXPECT_THROW(loader->next(requests[0].indices, true), WaitInterrupted);
  signaller.join();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 0.8);
  EXPECT_GT(loader->take_wait_seconds(), 0.03);
  // The request is still to come, and a wait that may not be interrupted (a step's later
  // micro-batches) waits for it whatever the stop.
  const Batch b = loader->next(requests[0].indices);
  EXPECT_TRUE(at::equal(b.targets, requests[0].indices));
  // Destroyed while both workers sleep in a fetch: it waits for those two, not for the pass.
  const auto destroy = Clock::now();
  loader.reset();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - destroy).count(), 4.0);
}

TEST(Loader, TheWaitWithoutWorkersIsTheFetch) {
  Probe data(50);
  const auto requests = eval_requests(at::arange(50, at::kLong), 10, 0);
  ASSERT_EQ(requests.size(), 5u);
  EXPECT_EQ(requests[0].context.epoch, -1);
  BatchLoader loader(data, requests, {0, 2, c10::kCPU, {}});
  for (const auto& r : requests) loader.next(r.indices);
  const double wait = loader.take_wait_seconds();
  EXPECT_GT(wait, 0.0);
  EXPECT_EQ(loader.take_wait_seconds(), 0.0);
}

// On a GPU: the batches arrive on the device, equal to the host's, through pinned memory and
// the side stream's copies; the compute stream may use them at once.
TEST(Loader, BatchesReachTheDeviceThroughPinnedMemoryInOrder_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Probe data(300);
  const auto requests = epoch_requests(at::arange(300, at::kLong).flip(0), 0, 32, 16, 0, 1, 1, 0);
  BatchLoader loader(data, requests, {2, 4, c10::Device(c10::kCUDA, 0), {}});
  for (const auto& r : requests) {
    const Batch b = loader.next(r.indices);
    ASSERT_TRUE(b.inputs.is_cuda());
    // Used on the compute stream right away, as the model would.
    const at::Tensor doubled = b.inputs * 2;
    const Batch host = data.get_batch(r.indices, r.context);
    ASSERT_TRUE(at::equal(doubled.cpu(), host.inputs * 2));
    ASSERT_TRUE(at::equal(b.targets.cpu(), host.targets));
  }
}

TEST(Loader, WorkersAndPrefetchAreKeysOfRunYaml) {
  EXPECT_EQ(parse_config("", "run.yaml").data.workers, kAutoCount);
  const RunConfig c = parse_config("data: {workers: 3, prefetch: 5}\n", "run.yaml");
  EXPECT_EQ(c.data.workers, 3);
  EXPECT_EQ(c.data.prefetch, 5);
  EXPECT_EQ(config_from_json(config_to_json(parse_config("", "run.yaml"))).data.workers,
            kAutoCount);
  EXPECT_EQ(config_to_json(parse_config("", "run.yaml"))["data"]["workers"], "auto");
  // Not a training key: a resume may change it.
  EXPECT_EQ(config_hash(c), config_hash(parse_config("", "run.yaml")));
  const std::pair<const char*, const char*> bad[] = {
      {"data: {workers: -1}\n", "data.workers must be a number >= 0 or auto, got -1"},
      {"data: {prefetch: 0}\n", "data.prefetch must be a number >= 1 or auto, got 0"},
      {"data: {workers: aut}\n", "did you mean auto?"},
      {"data: {workers: 1.5}\n", "data.workers"}};
  for (const auto& [yaml, message] : bad) {
    try {
      parse_config(yaml, "run.yaml");
      ADD_FAILURE() << yaml << " was accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(message), std::string::npos) << what;
      EXPECT_EQ(exit_code_for(e), 2);
    }
  }
}

}  // namespace
}  // namespace gpurun

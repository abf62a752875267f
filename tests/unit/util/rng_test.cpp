// Unit tests of the random generators' save and restore (RngGuard).
#include <ATen/ops/rand.h>
#include <torch/utils.h>

#include <gtest/gtest.h>

#include "util/rng.h"

namespace gpurun {
namespace {

TEST(RngGuard, PutsTheGeneratorBackWhereItWas) {
  torch::manual_seed(11);
  const at::Tensor expected = at::rand({8});
  torch::manual_seed(11);
  {
    RngGuard keep(default_generator(at::kCPU));
    EXPECT_EQ(keep.saved_bytes(),
              static_cast<int64_t>(rng_state(default_generator(at::kCPU)).nbytes()));
    at::rand({1000});  // moves the stream inside the guard only
  }
  EXPECT_TRUE(at::equal(at::rand({8}), expected));
}

TEST(RngGuard, WithAStartStateRunsFromItThenReturns) {
  torch::manual_seed(5);
  const at::Tensor start = rng_state(default_generator(at::kCPU));
  const at::Tensor from_start = at::rand({4});
  const at::Tensor after = rng_state(default_generator(at::kCPU));
  const at::Tensor next = at::rand({4});

  set_rng_state(default_generator(at::kCPU), after);
  {
    RngGuard fork(default_generator(at::kCPU), start);
    EXPECT_TRUE(at::equal(at::rand({4}), from_start)) << "the fork did not start at `start`";
  }
  EXPECT_TRUE(at::equal(at::rand({4}), next)) << "the stream did not return to `after`";
}

TEST(RngGuard, DefaultGeneratorOfTheCpuIsTheOneTorchSeeds) {
  torch::manual_seed(3);
  const at::Tensor seeded = rng_state(default_generator(at::kCPU));
  torch::manual_seed(4);
  EXPECT_FALSE(at::equal(rng_state(default_generator(at::kCPU)), seeded));
  torch::manual_seed(3);
  EXPECT_TRUE(at::equal(rng_state(default_generator(at::kCPU)), seeded));
}

}  // namespace
}  // namespace gpurun

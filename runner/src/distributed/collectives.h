// The collectives a distributed run needs, over c10d: a TCPStore rendezvous hosted by rank 0,
// and a Gloo (CPU) or NCCL (CUDA, compiled only when Torch has CUDA) process group.
//
// Gradient synchronisation follows PyTorch DDP's bucketing (Li et al. 2020, "PyTorch
// Distributed: Experiences on Accelerating Data Parallel Training"): gradients are copied into
// flat buckets of at most kBucketBytes, each bucket is all-reduced once, and the results are
// copied back. It runs once per optimizer step, after the last micro-batch's backward, never
// per micro-batch (docs/architecture.md, case 6). c10d's Reducer is not used: it hooks autograd to
// overlap the reduction with backward, which is the wrong time when gradients accumulate over
// micro-batches and interacts badly with activation checkpointing (docs/architecture.md, case 12);
// a reduction after backward has neither problem.
//
// Every call is collective: all ranks must make the same calls in the same order. A peer that
// died makes the call throw (Gloo: connection closed) or time out after `timeout_seconds`; the
// Error then names this rank, its host, the step, how long it waited and whether each peer's
// node still answers on the network (peer_probe.h), telling a partition from a stuck peer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "distributed/worker_env.h"
#include "optim/step_collectives.h"

namespace gpurun {

/// What the collectives moved, for the `step` event and the benchmark.
struct CollectiveStats {
  int64_t gradient_syncs = 0;        ///< sync_gradients() rounds
  int64_t all_reduce_calls = 0;      ///< c10d all-reduce calls, all purposes
  int64_t all_reduce_bytes = 0;      ///< bytes of the tensors handed to them
  int64_t reduce_scatter_bytes = 0;  ///< bytes of the reduce-scatters' inputs (all ranks' blocks)
  int64_t all_gather_bytes = 0;      ///< bytes of the all-gathers' outputs (all ranks' blocks)
  /// Bytes each rank sends with ring algorithms (Patarasuk & Yuan 2009): all-reduce
  /// 2 (N-1)/N x B, reduce-scatter and all-gather (N-1)/N x B each: the measure by which a
  /// sharded step (reduce-scatter + all-gather) moves what DDP's all-reduce moves.
  int64_t moved_bytes(int world_size) const;
};

class Collectives final : public StepCollectives {
 public:
  /// Bucket size cap, as DDP's default bucket_cap_mb = 25.
  static constexpr int64_t kBucketBytes = 25LL << 20;

  /// Joins the job `env` describes: rank 0 hosts the TCPStore at master_addr:master_port and
  /// waits for the others, then every rank creates the process group (NCCL when `device` is
  /// CUDA, else Gloo; GLOO_SOCKET_IFNAME picks Gloo's network interface as in PyTorch).
  /// Throws Error naming the address when the rendezvous does not complete within
  /// `timeout_seconds`, which is also the timeout of every later collective.
  static std::unique_ptr<Collectives> connect(const DistEnv& env, c10::Device device,
                                              double timeout_seconds);
  ~Collectives();

  int rank() const override;
  int world_size() const override;

  /// Sums the gradients of `params` over all ranks, in place, and `control` values with them
  /// (appended to the last bucket: flags and loss sums ride along at no extra round). A
  /// parameter without a gradient contributes zeros and has one afterwards. The caller scales
  /// each rank's gradient so that the sum is the mean over the global window. All parameters
  /// must be on this process group's device. One round: CollectiveStats::gradient_syncs + 1.
  void sync_gradients(const std::vector<at::Tensor>& params, std::vector<double>& control) override;

  /// StepCollectives::reduce_scatter: over NCCL c10d's _reduce_scatter_base; over Gloo on the
  /// CPU a ring of send/recv (Gloo's _reduce_scatter_base all-reduces a copy of the input, twice
  /// the bytes), whose sum of each chunk has a fixed order. Counted in
  /// CollectiveStats::reduce_scatter_bytes.
  void reduce_scatter(const at::Tensor& input, const at::Tensor& output) override;
  /// StepCollectives::all_gather, c10d's _allgather_base; counted in all_gather_bytes.
  void all_gather(const at::Tensor& input, const at::Tensor& output) override;

  /// Reduces `values` element-wise over all ranks (float64) and returns the result.
  std::vector<double> all_reduce(std::vector<double> values, Op op) override;

  /// Returns once every rank has called it.
  void barrier();

  /// Rank 0's `value` on every rank (through the store; for names and small JSON).
  std::string broadcast(const std::string& value);

  /// On rank 0: every rank's `value`, by rank; on the others: empty. Through the store.
  std::vector<std::string> gather(const std::string& value);

  /// Copies rank 0's `tensors` into every rank's (same shapes and order), in place.
  void broadcast_tensors(const std::vector<at::Tensor>& tensors);

  const CollectiveStats& stats() const;

  /// The global step the next collectives belong to, for the message of one that fails.
  void set_step(int64_t global_step);

 private:
  struct Impl;
  explicit Collectives(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpurun

#include "distributed/collectives.h"

#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(GPURUN_WITH_NCCL)
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "distributed/peer_probe.h"
#include "gpurun/errors.h"
#include "util/clock.h"
#include "util/error_report.h"
#include "util/text.h"
#include "util/units.h"

namespace gpurun {
namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || starts_with(host, "127.") || host == "::1";
}

/// The address the peers reach this rank at: loopback for a single-node job (which needs no
/// route to this host's public name, which containers and laptops often lack), else the one
/// the kernel routes to the master from. Not the host name's: Gloo's default binds to what the
/// name resolves to and falls back to loopback when it resolves to nothing, and peers on other
/// nodes can then never connect.
std::string reachable_address(const DistEnv& env) {
  if (is_loopback(env.master_addr)) return "127.0.0.1";
  const std::string local = source_address_towards(env.master_addr, env.master_port);
  return local.empty() ? "127.0.0.1" : local;
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& address) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"))
    return ::c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  return ::c10d::ProcessGroupGloo::createDeviceForHostname(address);
}

/// How long a failed collective waits for the peers' beacons (peer_probe.h).
constexpr double kProbeSeconds = 2.0;

}  // namespace

struct Collectives::Impl {
  DistEnv env;
  c10::Device device{c10::kCPU};
  c10::intrusive_ptr<::c10d::Store> store;
  // The backend in use, held by its own type (c10d::Backend's collectives are virtual, but the
  // NCCL one exists only in CUDA builds); run() dispatches.
  c10::intrusive_ptr<::c10d::ProcessGroupGloo> gloo;
#ifdef GPURUN_WITH_NCCL
  c10::intrusive_ptr<::c10d::ProcessGroupNCCL> nccl;
#endif
  template <class F>
  c10::intrusive_ptr<::c10d::Work> run(F&& f) {
#ifdef GPURUN_WITH_NCCL
    if (nccl) return f(*nccl);
#endif
    return f(*gloo);
  }
  CollectiveStats stats;
  int64_t sequence = 0;  // names the store keys of broadcast() and gather()
  int64_t step = -1;     // set_step()
  std::string host = host_name();
  std::unique_ptr<PeerBeacon> beacon;
  std::vector<PeerAddress> peers;  // every other rank

  void wait(c10::intrusive_ptr<::c10d::Work> work, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    try {
      work->wait();
    } catch (const std::exception& e) {
      const double seconds = seconds_since(start);
      const std::string at = step >= 0 ? " during step " + std::to_string(step) : "";
      throw PeerFailure(
          "rank " + std::to_string(env.rank) + " on " + host + ": " + what + " across " +
          std::to_string(env.world_size) + " ranks" + at + " failed after " +
          format_seconds(seconds) + " s: " + e.what() + "; " +
          partition_report(peers, peers_answering(peers, kProbeSeconds), kProbeSeconds));
    }
  }

  /// Publishes this rank's beacon and reads every peer's (peer_probe.h).
  void exchange_addresses(const std::string& address) {
    beacon = std::make_unique<PeerBeacon>(address);
    const PeerAddress mine{env.rank, host, address, beacon->port()};
    const std::string text = mine.to_text();
    store->set("gpurun/peer/" + std::to_string(env.rank),
               std::vector<uint8_t>(text.begin(), text.end()));
    for (int r = 0; r < env.world_size; ++r) {
      if (r == env.rank) continue;
      const std::vector<uint8_t> bytes = store->get("gpurun/peer/" + std::to_string(r));
      peers.push_back(PeerAddress::parse(r, std::string(bytes.begin(), bytes.end())));
    }
  }

  // Gloo's _reduce_scatter_base all-reduces a copy of the whole input and keeps this rank's
  // chunk: twice a reduce-scatter's bytes, and a copy of the input. Over Gloo the reduce-scatter
  // is a ring of point-to-point messages instead (the bandwidth-optimal ring of Patarasuk and
  // Yuan, J. Parallel Distrib. Comput. 69(2), 2009, as NCCL's): in step s of N - 1, rank r sends
  // its partial sum of chunk (r - s - 1) mod N to rank r + 1 and adds its own elements of chunk
  // (r - s - 2) mod N to what rank r - 1 sent of it. After N - 1 steps rank r holds chunk r summed
  // over every rank, each rank having sent (N - 1)/N of the input, the ring model's count
  // (CollectiveStats::moved_bytes). Chunk r is summed in a fixed order, g[r+1] + g[r+2] + ... +
  // g[r], so a run is repeatable; with 2 ranks it is one addition, bit for bit the all-reduce's.
  // `input` is read only (it may be the gradient buffer itself), `output` [W] is written.
  void ring_reduce_scatter(const at::Tensor& input, const at::Tensor& output) {
    const int n = env.world_size, r = env.rank;
    const int64_t w = output.numel();
    if (w == 0) return;
    const at::Tensor chunks = input.view({n, w});
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    at::Tensor received = at::empty({w}, output.options());
    at::Tensor partial = n > 2 ? at::empty({w}, output.options()) : at::Tensor();
    at::Tensor sending = chunks[(r + n - 1) % n];
    for (int s = 0; s < n - 1; ++s) {
      const int tag = static_cast<int>(ring_tag++ % (1 << 20));  // the ranks count alike
      std::vector<at::Tensor> out{sending}, in{received};
      auto sent = gloo->send(out, next, tag);
      auto got = gloo->recv(in, prev, tag);
      wait(got, "reduce-scatter");
      wait(sent, "reduce-scatter");  // before `partial`, being sent, is written again
      at::Tensor target = s == n - 2 ? output : partial;
      at::add_out(target, chunks[((r - s - 2) % n + n) % n], received);
      sending = target;
    }
  }
  int64_t ring_tag = 0;

  void all_reduce_in_place(at::Tensor& flat, ::c10d::ReduceOp op) {
    std::vector<at::Tensor> tensors{flat};
    ::c10d::AllreduceOptions options;
    options.reduceOp = op;
    ++stats.all_reduce_calls;
    stats.all_reduce_bytes += static_cast<int64_t>(flat.nbytes());
    wait(run([&](auto& g) { return g.allreduce(tensors, options); }), "all-reduce");
  }
};

Collectives::Collectives(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Collectives::~Collectives() = default;

std::unique_ptr<Collectives> Collectives::connect(const DistEnv& env, c10::Device device,
                                                  double timeout_seconds) {
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->device = device;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    ::c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(env.master_port);
    options.isServer = env.rank == 0;
    options.numWorkers = static_cast<std::size_t>(env.world_size);
    options.waitWorkers = true;
    options.timeout = timeout;
    impl->store = c10::make_intrusive<::c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
                ": rendezvous at " + where + " failed within " +
                std::to_string(static_cast<int>(timeout_seconds)) + " s: " + e.what());
  }
  const std::string address = reachable_address(env);
  impl->exchange_addresses(address);
  auto group_store = c10::make_intrusive<::c10d::PrefixStore>("pg", impl->store);
  if (device.is_cuda()) {
#ifdef GPURUN_WITH_NCCL
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
    auto options = ::c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    impl->nccl = c10::make_intrusive<::c10d::ProcessGroupNCCL>(group_store, env.rank,
                                                               env.world_size, options);
#else
    throw ConfigError("a distributed run on CUDA needs a LibTorch built with NCCL");
#endif
  } else {
    auto options = ::c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(gloo_device(address));
    impl->gloo = c10::make_intrusive<::c10d::ProcessGroupGloo>(group_store, env.rank,
                                                               env.world_size, options);
  }
  spdlog::info("rank {} of {} on {} ({}) joined the process group at {} ({})", env.rank,
               env.world_size, impl->host, address, where, device.is_cuda() ? "NCCL" : "Gloo");
  return std::unique_ptr<Collectives>(new Collectives(std::move(impl)));
}

void Collectives::set_step(int64_t global_step) { impl_->step = global_step; }

int Collectives::rank() const { return impl_->env.rank; }
int Collectives::world_size() const { return impl_->env.world_size; }
const CollectiveStats& Collectives::stats() const { return impl_->stats; }

void Collectives::sync_gradients(const std::vector<at::Tensor>& params,
                                 std::vector<double>& control) {
  at::NoGradGuard no_grad;
  // Buckets of consecutive parameters of one dtype, each at most kBucketBytes (a parameter
  // larger than that is a bucket of its own).
  std::vector<std::pair<size_t, size_t>> buckets;  // [first, last) parameter indices
  for (size_t i = 0; i < params.size();) {
    size_t j = i;
    int64_t bytes = 0;
    while (j < params.size() && params[j].scalar_type() == params[i].scalar_type() &&
           (j == i || bytes + static_cast<int64_t>(params[j].nbytes()) <= kBucketBytes))
      bytes += static_cast<int64_t>(params[j++].nbytes());
    buckets.emplace_back(i, j);
    i = j;
  }
  if (buckets.empty()) buckets.emplace_back(0, 0);
  for (size_t b = 0; b < buckets.size(); ++b) {
    const auto [first, last] = buckets[b];
    const bool with_control = b + 1 == buckets.size();
    const auto dtype = first < last ? params[first].scalar_type() : at::kDouble;
    std::vector<at::Tensor> pieces;
    for (size_t i = first; i < last; ++i) {
      const at::Tensor& g = params[i].grad();
      pieces.push_back(g.defined() ? g.reshape(-1)
                                   : at::zeros({params[i].numel()}, params[i].options()));
    }
    if (with_control)
      pieces.push_back(
          at::tensor(control, at::TensorOptions().dtype(at::kDouble)).to(impl_->device, dtype));
    at::Tensor flat = at::cat(pieces);
    impl_->all_reduce_in_place(flat, ::c10d::ReduceOp::SUM);
    int64_t offset = 0;
    for (size_t i = first; i < last; ++i) {
      at::Tensor p = params[i];
      const int64_t n = p.numel();
      at::Tensor part = flat.narrow(0, offset, n).view(p.sizes());
      if (p.grad().defined())
        p.mutable_grad().copy_(part);
      else
        p.mutable_grad() = part.clone();
      offset += n;
    }
    if (with_control) {
      at::Tensor values =
          flat.narrow(0, offset, static_cast<int64_t>(control.size())).to(at::kCPU, at::kDouble);
      for (size_t k = 0; k < control.size(); ++k) control[k] = values.data_ptr<double>()[k];
    }
  }
  ++impl_->stats.gradient_syncs;
}

void Collectives::reduce_scatter(const at::Tensor& input, const at::Tensor& output) {
  at::Tensor in = input, out = output;
  impl_->stats.reduce_scatter_bytes += static_cast<int64_t>(in.nbytes());
  if (impl_->gloo && impl_->device.is_cpu()) {
    impl_->ring_reduce_scatter(in, out);
    return;
  }
  ::c10d::ReduceScatterOptions options;
  options.reduceOp = ::c10d::ReduceOp::SUM;
  impl_->wait(impl_->run([&](auto& g) { return g._reduce_scatter_base(out, in, options); }),
              "reduce-scatter");
}

void Collectives::all_gather(const at::Tensor& input, const at::Tensor& output) {
  at::Tensor in = input, out = output;
  impl_->stats.all_gather_bytes += static_cast<int64_t>(out.nbytes());
  impl_->wait(impl_->run([&](auto& g) { return g._allgather_base(out, in); }), "all-gather");
}

int64_t CollectiveStats::moved_bytes(int world_size) const {
  if (world_size < 2) return 0;
  const double share = static_cast<double>(world_size - 1) / world_size;
  return static_cast<int64_t>(share * (2.0 * static_cast<double>(all_reduce_bytes) +
                                       static_cast<double>(reduce_scatter_bytes) +
                                       static_cast<double>(all_gather_bytes)));
}

std::vector<double> Collectives::all_reduce(std::vector<double> values, Op op) {
  if (values.empty()) return values;
  at::Tensor flat = at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(impl_->device);
  impl_->all_reduce_in_place(flat, op == Op::kMax ? ::c10d::ReduceOp::MAX : ::c10d::ReduceOp::SUM);
  flat = flat.to(at::kCPU);
  for (size_t k = 0; k < values.size(); ++k) values[k] = flat.data_ptr<double>()[k];
  return values;
}

void Collectives::barrier() {
  impl_->wait(impl_->run([](auto& g) { return g.barrier(); }), "barrier");
}

std::string Collectives::broadcast(const std::string& value) {
  const std::string key = "gpurun/broadcast/" + std::to_string(impl_->sequence++);
  if (rank() == 0) {
    impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    return value;
  }
  const std::vector<uint8_t> bytes = impl_->store->get(key);
  return std::string(bytes.begin(), bytes.end());
}

std::vector<std::string> Collectives::gather(const std::string& value) {
  const std::string prefix = "gpurun/gather/" + std::to_string(impl_->sequence++) + "/";
  if (rank() != 0) {
    impl_->store->set(prefix + std::to_string(rank()),
                      std::vector<uint8_t>(value.begin(), value.end()));
    return {};
  }
  std::vector<std::string> out{value};
  for (int r = 1; r < world_size(); ++r) {
    const std::vector<uint8_t> bytes = impl_->store->get(prefix + std::to_string(r));
    out.emplace_back(bytes.begin(), bytes.end());
  }
  return out;
}

void Collectives::broadcast_tensors(const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  for (const at::Tensor& t : tensors) {
    std::vector<at::Tensor> one{t};
    ::c10d::BroadcastOptions options;
    options.rootRank = 0;
    impl_->wait(impl_->run([&](auto& g) { return g.broadcast(one, options); }), "broadcast");
  }
}

}  // namespace gpurun

// Attention bench (issue 40, item 3): the gpt's causal self-attention at context 1024 on the
// CPU, forward and backward, as the gpt computed it before (softmax(Q K^T / sqrt(d)) through
// at::matmul and masked_fill_, the [B, heads, T, T] scores kept for the backward pass) and as
// it does now (at::scaled_dot_product_attention, is_causal: ATen's flash kernel), measured side
// by side in one run, interleaved: peak allocated bytes under the CPU meter and step time, in
// fp32 and under bf16 autocast. Both give the same output within float rounding (checked).
//
// Usage: gpurun_bench_attention [CONTEXT=1024] [BATCH=4] [WIDTH=512] [HEADS=8] [REPEATS=5]
#include <ATen/Parallel.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "memory/meter.h"
#include "model/precision.h"
#include "util/units.h"

namespace {

struct Shape {
  int64_t batch, time, width, heads;
};

at::Tensor materialized(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t time = q.size(2), head_width = q.size(3);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(head_width));
  const at::Tensor future = at::ones({time, time}, q.options().dtype(at::kBool)).triu_(1);
  scores.masked_fill_(future, -std::numeric_limits<float>::infinity());
  return at::matmul(scores.softmax(-1), v);
}

at::Tensor fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
}

struct Result {
  double seconds = 0;
  int64_t peak = 0;
  at::Tensor out;
};

/// One forward and backward of qkv -> attention -> projection, as a gpt block's attention.
Result step(bool use_fused, gpurun::Precision precision, const Shape& s, torch::nn::Linear& qkv,
            torch::nn::Linear& projection, const at::Tensor& x) {
  auto meter = gpurun::make_cpu_meter(0);
  const auto start = std::chrono::steady_clock::now();
  Result r;
  {
    at::Tensor y;
    {
      gpurun::AutocastGuard autocast(precision, c10::kCPU);
      const int64_t hw = s.width / s.heads;
      const at::Tensor t = qkv(x).view({s.batch, s.time, 3, s.heads, hw}).permute({2, 0, 3, 1, 4});
      const at::Tensor a = use_fused ? fused(t[0], t[1], t[2]) : materialized(t[0], t[1], t[2]);
      y = projection(a.transpose(1, 2).reshape({s.batch, s.time, s.width}));
    }
    y.to(at::kFloat).square().sum().backward();
    r.out = y.detach().to(at::kFloat);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.peak = meter->peak_bytes();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const auto arg = [&](int i, int64_t fallback) {
    return argc > i ? std::atoll(argv[i]) : fallback;
  };
  const Shape s{arg(2, 4), arg(1, 1024), arg(3, 512), arg(4, 8)};
  const int repeats = static_cast<int>(arg(5, 5));
  torch::manual_seed(1);
  torch::nn::Linear qkv(s.width, 3 * s.width), projection(s.width, s.width);
  const at::Tensor x = torch::randn({s.batch, s.time, s.width});
  std::printf(
      "causal self-attention, context %lld, micro-batch %lld, width %lld, %lld heads, %d "
      "threads; forward + backward of qkv -> attention -> projection, median of %d, "
      "interleaved\n",
      static_cast<long long>(s.time), static_cast<long long>(s.batch),
      static_cast<long long>(s.width), static_cast<long long>(s.heads), at::get_num_threads(),
      repeats);
  std::printf("%-6s %-26s %12s %10s %10s\n", "", "attention", "peak", "s/step", "");
  for (const gpurun::Precision precision : {gpurun::Precision::kFp32, gpurun::Precision::kBf16}) {
    std::vector<double> times[2];
    int64_t peaks[2] = {0, 0};
    at::Tensor outs[2];
    for (int i = 0; i < repeats + 1; ++i) {
      for (int f = 0; f < 2; ++f) {
        qkv->zero_grad();
        projection->zero_grad();
        const Result r = step(f == 1, precision, s, qkv, projection, x);
        if (i == 0) continue;  // warm-up
        times[f].push_back(r.seconds);
        peaks[f] = std::max(peaks[f], r.peak);
        outs[f] = r.out;
      }
    }
    for (auto& t : times) std::sort(t.begin(), t.end());
    const double before = times[0][times[0].size() / 2], after = times[1][times[1].size() / 2];
    const double difference = (outs[0] - outs[1]).abs().max().item<double>() /
                              std::max(outs[0].abs().max().item<double>(), 1e-30);
    const char* name = gpurun::precision_name(precision);
    std::printf("%-6s %-26s %12s %10.3f\n", name, "materialized (before)",
                gpurun::format_bytes(peaks[0]).c_str(), before);
    std::printf("%-6s %-26s %12s %10.3f\n", name, "scaled_dot_product (now)",
                gpurun::format_bytes(peaks[1]).c_str(), after);
    std::printf("%-6s now / before: peak %.2fx, step time %.2fx; outputs agree within %.1e\n", name,
                static_cast<double>(peaks[1]) / peaks[0], after / before, difference);
  }
  return 0;
}

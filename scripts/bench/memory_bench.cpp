// Memory bench: for a deep MLP and a CNN, measured peak bytes and step time without and with
// activation checkpointing, and with gradient accumulation (4 micro-batches of a quarter), all
// probed on the real model and data in one run. Prints memory saved and compute overhead.
//
// Usage: gpurun_bench_memory [BATCH=256]
#include <cstdio>
#include <cstdlib>

#include "builtin.h"
#include "gpurun/config.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "memory/meter.h"
#include "memory/peak_probe.h"
#include "train/run_setup.h"
#include "util/units.h"

namespace {

void bench(const char* title, const std::vector<std::string>& sets, int64_t batch,
           const gpurun::Registry& registry) {
  std::vector<std::string> all = sets;
  all.push_back("data.train_samples=" + std::to_string(batch * 4));
  all.push_back("data.eval_samples=100");
  all.push_back("memory.probe_steps=4");
  const gpurun::RunConfig c = gpurun::parse_config("", "bench", all);
  gpurun::Session s = gpurun::open_session(c, "cpu", 0, registry);
  gpurun::Prober prober(*s.model, s.data, c.optim, *s.meter, c.memory.probe_steps, s.device,
                        s.loss);
  const gpurun::Probe plain = prober.train(batch, false);
  const gpurun::Probe ckpt = prober.train(batch, true);
  const gpurun::Probe quarter = prober.train(batch / 4, false);
  const double accum_seconds = 4 * quarter.step_seconds;  // same samples as one full step
  std::printf("%s, batch %lld, %zu segments\n", title, static_cast<long long>(batch),
              s.model->segments().size());
  std::printf("  %-34s %12s %10s %12s %10s\n", "", "peak", "vs plain", "s/step", "vs plain");
  auto row = [&](const char* name, int64_t peak, double seconds) {
    std::printf("  %-34s %12s %9.2fx %12.4f %9.2fx\n", name, gpurun::format_bytes(peak).c_str(),
                static_cast<double>(peak) / plain.peak_bytes, seconds,
                seconds / plain.step_seconds);
  };
  row("plain", plain.peak_bytes, plain.step_seconds);
  row("activation checkpointing", ckpt.peak_bytes, ckpt.step_seconds);
  row("accumulation 4 x micro-batch/4", quarter.peak_bytes, accum_seconds);
  std::printf(
      "  memory saved: checkpointing %.0f%%, accumulation %.0f%%; compute overhead: "
      "checkpointing %+.0f%%, accumulation %+.0f%%\n\n",
      100.0 * (1 - static_cast<double>(ckpt.peak_bytes) / plain.peak_bytes),
      100.0 * (1 - static_cast<double>(quarter.peak_bytes) / plain.peak_bytes),
      100.0 * (ckpt.step_seconds / plain.step_seconds - 1),
      100.0 * (accum_seconds / plain.step_seconds - 1));
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t batch = argc > 1 ? std::atoll(argv[1]) : 256;
  gpurun::Registry registry;
  gpurun::register_builtin_plugins(registry);
  bench("deep MLP (8 x 1024)",
        {"model.name=mlp", "model.hidden=[1024,1024,1024,1024,1024,1024,1024,1024]"}, batch,
        registry);
  bench("CNN (32, 64, BatchNorm)",
        {"model.name=cnn", "model.channels=[32,64]", "model.batch_norm=true"}, batch, registry);
  return 0;
}

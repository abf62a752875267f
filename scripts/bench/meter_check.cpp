// The memory meter against PyTorch's own counter: the peak allocated bytes of one training step
// of an MLP (784-2048-2048-10, batch 256, SGD without momentum), measured by gpurun's
// MemoryMeter. scripts/bench/meter_reference.py runs the same step in Python and prints
// torch.cuda.max_memory_allocated(); scripts/gpu-check.sh compares the two (goal: within 1%).
//
// Usage: gpurun_bench_meter [cuda|cpu]    prints the peak in bytes on its last line
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdio>
#include <string>

#include "memory/meter.h"

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "cuda";
  const c10::Device device(name == "cpu" ? c10::kCPU : c10::kCUDA, name == "cpu" ? -1 : 0);
  auto meter = gpurun::make_meter(device, 0);
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(784, 2048), torch::nn::ReLU(),
                              torch::nn::Linear(2048, 2048), torch::nn::ReLU(),
                              torch::nn::Linear(2048, 10));
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  const at::Tensor x = at::randn({256, 784}).to(device);
  const at::Tensor y = at::randint(0, 10, {256}).to(device);
  auto step = [&] {
    optimizer.zero_grad();  // set_to_none, as Python's default
    at::Tensor loss = at::cross_entropy_loss(model->forward(x), y);
    loss.backward();
    optimizer.step();
  };
  step();  // warm-up: cuBLAS workspaces, the first gradients
  meter->reset_peak();
  step();
  std::printf("device %s, current %lld bytes\n%lld\n", meter->device_name().c_str(),
              static_cast<long long>(meter->current_bytes()),
              static_cast<long long>(meter->peak_bytes()));
  return 0;
}

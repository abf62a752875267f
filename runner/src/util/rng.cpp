#include "util/rng.h"

#include <mutex>
#include <utility>

#include <ATen/Context.h>

namespace gpurun {

at::Generator default_generator(const c10::Device& device) {
  return at::globalContext().defaultGenerator(device);  // the CPU one for kCPU
}

at::Tensor rng_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_rng_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

RngGuard::RngGuard(at::Generator generator)
    : generator_(std::move(generator)), saved_(rng_state(generator_)) {}

RngGuard::RngGuard(at::Generator generator, const at::Tensor& start)
    : RngGuard(std::move(generator)) {
  set_rng_state(generator_, start);
}

RngGuard::~RngGuard() { set_rng_state(generator_, saved_); }

}  // namespace gpurun

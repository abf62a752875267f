#include "optim/grad_scaler.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/full.h>
#include <torch/optim/optimizer.h>

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "gpurun/errors.h"

namespace gpurun {

GradScaler::GradScaler(c10::Device device, Options options) : options_(options) {
  const auto on = at::TensorOptions().device(device);
  scale_ = at::full({}, options_.init_scale, on.dtype(at::kFloat));
  growth_tracker_ = at::full({}, 0, on.dtype(at::kInt));
  found_inf_ = at::full({}, 0.0, on.dtype(at::kFloat));
}

double GradScaler::scale_value() const { return scale_.item<double>(); }

void GradScaler::unscale(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  unscale_tensors(grads);
}

void GradScaler::unscale_tensors(const std::vector<at::Tensor>& grads) {
  if (unscaled_)
    throw std::logic_error("GradScaler::unscale() was already called since the last update()");
  // In double, then float, as PyTorch computes its inv_scale.
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  found_inf_.zero_();
  // One call per dtype, as the kernel requires (PyTorch groups by device and dtype too).
  for (const c10::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    std::vector<at::Tensor> group;
    for (const at::Tensor& g : grads)
      if (g.scalar_type() == dtype) group.push_back(g);
    if (!group.empty())
      at::_amp_foreach_non_finite_check_and_unscale_(group, found_inf_, inv_scale);
  }
  unscaled_ = true;
}

double GradScaler::found_inf() const { return found_inf_.item<double>(); }

void GradScaler::set_found_inf(double value) { found_inf_.fill_(value); }

bool GradScaler::step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params) {
  if (!unscaled_) unscale(params);
  if (found_inf_.item<float>() != 0.0f) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
  unscaled_ = false;
}

nlohmann::json GradScaler::state_dict() const {
  return {{"scale", scale_.item<double>()},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", options_.growth_interval},
          {"_growth_tracker", growth_tracker_.item<int64_t>()}};
}

void GradScaler::load_state_dict(const nlohmann::json& state) {
  try {
    const double scale = state.at("scale").get<double>();
    const int64_t tracker = state.at("_growth_tracker").get<int64_t>();
    if (!(scale > 0) || tracker < 0) throw std::invalid_argument("out of range");
    options_.growth_factor = state.at("growth_factor").get<double>();
    options_.backoff_factor = state.at("backoff_factor").get<double>();
    options_.growth_interval = state.at("growth_interval").get<int64_t>();
    scale_.fill_(scale);
    growth_tracker_.fill_(tracker);
  } catch (const std::exception& e) {
    throw ResumeError("the checkpoint's grad_scaler state " + state.dump() +
                      " is not a GradScaler state_dict: " + e.what());
  }
  unscaled_ = false;
}

}  // namespace gpurun

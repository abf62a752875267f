#include "gpurun/registry.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <optional>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "config/suggest.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "util/rng.h"

namespace gpurun {

namespace {
template <typename Map>
std::vector<std::string> keys_of(const Map& map) {
  std::vector<std::string> out;
  for (const auto& entry : map) out.push_back(entry.first);
  return out;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

template <typename Map>
const typename Map::mapped_type& find_or_throw(const Map& map, const std::string& name,
                                               const char* key) {
  auto it = map.find(name);
  if (it == map.end()) {
    const std::vector<std::string> names = keys_of(map);
    const std::string nearest = detail::nearest_of(name, names);
    throw ConfigError(std::string(key) + ": unknown name \"" + name + "\"" +
                      (nearest.empty() ? "" : "; did you mean " + nearest + "?") +
                      "; registered: " + joined(names));
  }
  return it->second;
}

}  // namespace

Registry::Registry() { add_loss("cross_entropy", cross_entropy); }

void Registry::add_model(const std::string& name, ModelFactory factory) {
  if (!models_.emplace(name, std::move(factory)).second)
    throw std::logic_error("model \"" + name + "\" is registered twice");
}

void Registry::add_dataset(const std::string& name, DatasetFactory factory) {
  if (!datasets_.emplace(name, std::move(factory)).second)
    throw std::logic_error("dataset \"" + name + "\" is registered twice");
}

void Registry::add_loss(const std::string& name, LossFn loss) {
  if (!losses_.emplace(name, std::move(loss)).second)
    throw std::logic_error("loss \"" + name + "\" is registered twice");
}

void Registry::add_epoch_hook(const std::string& name, EpochHook hook) {
  if (!epoch_hooks_.emplace(name, std::move(hook)).second)
    throw std::logic_error("epoch hook \"" + name + "\" is registered twice");
}

std::shared_ptr<SegmentedModel> Registry::make_model(const ModelConfig& config,
                                                     const std::vector<int64_t>& input_shape,
                                                     int64_t num_classes) const {
  return find_or_throw(models_, config.name, "model.name")(config, input_shape, num_classes);
}

DatasetSplits Registry::make_dataset(const DataConfig& config) const {
  return find_or_throw(datasets_, config.name, "data.name")(config);
}

LossFn Registry::make_loss(const std::string& name) const {
  return find_or_throw(losses_, name, "train.loss");
}

void Registry::add_step_hook(const std::string& name, StepHook hook) {
  if (!step_hooks_.emplace(name, std::move(hook)).second)
    throw std::logic_error("step hook \"" + name + "\" is registered twice");
}

void Registry::run_step_hooks(const StepEnd& end) const {
  for (const auto& [name, hook] : step_hooks_) {
    try {
      hook(end);
    } catch (const std::exception& e) {
      if (failed_step_hooks_.insert(name).second)
        spdlog::error(
            "step hook {} failed at global step {}: {}; training goes on (further "
            "failures of this hook are not logged)",
            name, end.global_step, e.what());
    }
  }
}

void Registry::run_epoch_hooks(const EpochEnd& end) const {
  if (epoch_hooks_.empty()) return;
  RngGuard cpu_rng(default_generator(at::kCPU));
  std::optional<RngGuard> device_rng;
  if (!end.device.is_cpu()) device_rng.emplace(default_generator(end.device));
  const bool was_training = end.model.is_training();
  end.model.eval();
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, hook] : epoch_hooks_) {
      try {
        hook(end);
      } catch (const std::exception& e) {
        spdlog::error("epoch hook {} failed after epoch {}: {}; training goes on", name,
                      end.epoch + 1, e.what());
      }
    }
  }
  if (was_training) end.model.train();
}

std::vector<std::string> Registry::model_names() const { return keys_of(models_); }
std::vector<std::string> Registry::dataset_names() const { return keys_of(datasets_); }
std::vector<std::string> Registry::loss_names() const { return keys_of(losses_); }

}  // namespace gpurun

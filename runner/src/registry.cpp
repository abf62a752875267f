#include "gpurun/registry.h"

#include <stdexcept>

#include "gpurun/errors.h"

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
  if (it == map.end())
    throw ConfigError(std::string(key) + ": unknown name \"" + name +
                      "\"; registered: " + joined(keys_of(map)));
  return it->second;
}
}  // namespace

void Registry::add_model(const std::string& name, ModelFactory factory) {
  if (!models_.emplace(name, std::move(factory)).second)
    throw std::logic_error("model \"" + name + "\" is registered twice");
}

void Registry::add_dataset(const std::string& name, DatasetFactory factory) {
  if (!datasets_.emplace(name, std::move(factory)).second)
    throw std::logic_error("dataset \"" + name + "\" is registered twice");
}

std::shared_ptr<SegmentedModel> Registry::make_model(const ModelConfig& config,
                                                     const std::vector<int64_t>& input_shape,
                                                     int64_t num_classes) const {
  return find_or_throw(models_, config.name, "model.name")(config, input_shape, num_classes);
}

DatasetSplits Registry::make_dataset(const DataConfig& config) const {
  return find_or_throw(datasets_, config.name, "data.name")(config);
}

std::vector<std::string> Registry::model_names() const { return keys_of(models_); }
std::vector<std::string> Registry::dataset_names() const { return keys_of(datasets_); }

}  // namespace gpurun

// Name -> factory registries for models and datasets (built-ins in plugins/, user plugins
// later through one extern "C" entry point).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpurun/config.h"
#include "gpurun/dataset.h"

namespace gpurun {

class SegmentedModel;

/// Builds a model for samples of `input_shape` (e.g. {1, 28, 28}) and `num_classes` outputs.
using ModelFactory = std::function<std::shared_ptr<SegmentedModel>(
    const ModelConfig& config, const std::vector<int64_t>& input_shape, int64_t num_classes)>;
/// Loads both splits of a dataset. Throws ConfigError for a bad path or file.
using DatasetFactory = std::function<DatasetSplits(const DataConfig& config)>;

class Registry {
 public:
  /// Throws std::logic_error when `name` is already registered.
  void add_model(const std::string& name, ModelFactory factory);
  void add_dataset(const std::string& name, DatasetFactory factory);

  /// Throw ConfigError naming the unknown name and the registered ones.
  std::shared_ptr<SegmentedModel> make_model(const ModelConfig& config,
                                             const std::vector<int64_t>& input_shape,
                                             int64_t num_classes) const;
  DatasetSplits make_dataset(const DataConfig& config) const;

  std::vector<std::string> model_names() const;
  std::vector<std::string> dataset_names() const;

 private:
  std::map<std::string, ModelFactory> models_;
  std::map<std::string, DatasetFactory> datasets_;
};

}  // namespace gpurun

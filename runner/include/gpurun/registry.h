// Name -> factory registries for models, datasets and losses, and the hooks run at the end of
// every epoch (built-ins in plugins/, user plugins later through one extern "C" entry point).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "gpurun/config.h"
#include "gpurun/dataset.h"
#include "gpurun/loss.h"

namespace gpurun {

class SegmentedModel;

/// Builds a model for samples of `input_shape` (e.g. {1, 28, 28}) and `num_classes` outputs.
using ModelFactory = std::function<std::shared_ptr<SegmentedModel>(
    const ModelConfig& config, const std::vector<int64_t>& input_shape, int64_t num_classes)>;
/// Loads both splits of a dataset. Throws ConfigError for a bad path or file.
using DatasetFactory = std::function<DatasetSplits(const DataConfig& config)>;

/// What an epoch-end hook sees: the run's config, the model (in eval mode, grad disabled),
/// both data splits, the device, and the epoch just finished (0-based) with the optimizer
/// steps done so far.
struct EpochEnd {
  const RunConfig& config;
  SegmentedModel& model;
  const DatasetSplits& data;
  c10::Device device;
  int64_t epoch;
  int64_t global_step;
};
/// Runs after each epoch's evaluation, before its checkpoint (e.g. prints a generated
/// sample). A hook decides itself whether it applies to the run (by config, data, model).
using EpochHook = std::function<void(const EpochEnd& end)>;

/// What a step hook sees after each optimizer step: scalars only, so that an observer (a
/// logger, an experiment tracker) can never change what is learned.
struct StepEnd {
  const RunConfig& config;
  int rank;             ///< the rank this process is (0 for a single process)
  int64_t epoch;        ///< 0-based
  int64_t global_step;  ///< optimizer steps done, this one included
  double loss;          ///< mean loss of the step's global batch
  double lr;            ///< learning rate the step used
};
/// Runs on every rank after each optimizer step (and after any checkpoint it triggers).
using StepHook = std::function<void(const StepEnd& end)>;

class Registry {
 public:
  /// Holds the built-in loss "cross_entropy" (loss.h).
  Registry();

  /// Throws std::logic_error when `name` is already registered.
  void add_model(const std::string& name, ModelFactory factory);
  void add_dataset(const std::string& name, DatasetFactory factory);
  void add_loss(const std::string& name, LossFn loss);
  void add_epoch_hook(const std::string& name, EpochHook hook);
  void add_step_hook(const std::string& name, StepHook hook);

  /// Throw ConfigError naming the unknown name and the registered ones.
  std::shared_ptr<SegmentedModel> make_model(const ModelConfig& config,
                                             const std::vector<int64_t>& input_shape,
                                             int64_t num_classes) const;
  DatasetSplits make_dataset(const DataConfig& config) const;
  /// The loss named `name` (train.loss).
  LossFn make_loss(const std::string& name) const;

  /// Runs every epoch hook, in name order, with `end.model` in eval mode under NoGradGuard,
  /// and puts it back in training mode afterwards. The default CPU generator (and that of
  /// `end.device` when it is not the CPU) is saved before and restored after, so a hook that
  /// draws random numbers leaves the training RNG stream, hence exact resume, untouched. A
  /// hook that throws std::exception is logged as an error and training goes on (the sample
  /// of an epoch is not worth a lost run).
  void run_epoch_hooks(const EpochEnd& end) const;

  /// Runs every step hook, in name order. A hook that throws std::exception is logged as an
  /// error (once per hook) and training goes on.
  void run_step_hooks(const StepEnd& end) const;

  /// The registered names in sorted order: what model.name, data.name and train.loss may name.
  std::vector<std::string> model_names() const;
  std::vector<std::string> dataset_names() const;
  std::vector<std::string> loss_names() const;

 private:
  std::map<std::string, ModelFactory> models_;
  std::map<std::string, DatasetFactory> datasets_;
  std::map<std::string, LossFn> losses_;
  std::map<std::string, EpochHook> epoch_hooks_;
  std::map<std::string, StepHook> step_hooks_;
  mutable std::set<std::string> failed_step_hooks_;  ///< logged once each
};

}  // namespace gpurun

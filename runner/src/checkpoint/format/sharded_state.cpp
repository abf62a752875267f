#include "checkpoint/format/sharded_state.h"

#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <future>
#include <map>
#include <memory>
#include <unordered_map>

#include "checkpoint/format/shard_files.h"
#include "checkpoint/format/state_copy.h"
#include "gpurun/errors.h"
#include "optim/flat_optimizer.h"
#include "optim/step_optimizer.h"

namespace gpurun {
namespace {

namespace optim = torch::optim;
using json = nlohmann::json;

std::string optim_name(const json& config) {
  const json o = config.is_object() ? config.value("optim", json::object()) : json::object();
  return o.is_object() ? o.value("name", std::string()) : std::string();
}

/// model.pt on a second thread while this one reads the optimizer's state (see
/// train_state.cpp's restore_state()); on this thread for the memory probe's checkpoint.
std::future<NamedTensors> read_weights(const LoadedCheckpoint& checkpoint) {
  const auto policy = checkpoint.files.empty() ? std::launch::async : std::launch::deferred;
  return std::async(policy,
                    [&checkpoint] { return load_checkpoint_tensors(checkpoint, "model.pt"); });
}

/// The model's trainable parameters by name (the names FlatLayout and the index use).
std::vector<std::pair<std::string, at::Tensor>> trainable_named(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    if (item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  return out;
}

/// A host optimizer of optim.name `name` over `n` placeholder parameters, for LibTorch's
/// archive (which names parameters by position only).
std::unique_ptr<optim::Optimizer> placeholder_optimizer(const std::string& name, size_t n,
                                                        std::vector<at::Tensor>& placeholders) {
  placeholders.clear();
  for (size_t i = 0; i < n; ++i) placeholders.push_back(at::empty({0}));
  if (name == "adamw") return std::make_unique<optim::AdamW>(placeholders, optim::AdamWOptions());
  if (name == "adam") return std::make_unique<optim::Adam>(placeholders, optim::AdamOptions());
  return std::make_unique<optim::SGD>(placeholders, optim::SGDOptions(0.1));
}

/// The tensor of LibTorch state `state` ("exp_avg", ...) of one parameter; undefined if none.
at::Tensor libtorch_state(const optim::OptimizerParamState& s, const std::string& state) {
  if (const auto* a = dynamic_cast<const optim::AdamWParamState*>(&s))
    return state == "exp_avg"      ? a->exp_avg()
           : state == "exp_avg_sq" ? a->exp_avg_sq()
                                   : at::Tensor();
  if (const auto* a = dynamic_cast<const optim::AdamParamState*>(&s))
    return state == "exp_avg"      ? a->exp_avg()
           : state == "exp_avg_sq" ? a->exp_avg_sq()
                                   : at::Tensor();
  if (const auto* g = dynamic_cast<const optim::SGDParamState*>(&s))
    return state == "momentum_buffer" ? g->momentum_buffer() : at::Tensor();
  return {};
}

int64_t libtorch_step(const optim::OptimizerParamState& s) {
  if (const auto* a = dynamic_cast<const optim::AdamWParamState*>(&s)) return a->step();
  if (const auto* a = dynamic_cast<const optim::AdamParamState*>(&s)) return a->step();
  return -1;  // SGD keeps no step
}

/// Fills `staging` (name -> host fp32 [S]) for rank `flat`'s slice from an unsharded
/// checkpoint's optim.pt; returns the step count.
int64_t slice_libtorch_state(const LoadedCheckpoint& checkpoint, FlatOptimizer& flat,
                             std::map<std::string, at::Tensor>& staging) {
  torch::serialize::InputArchive archive;
  load_optimizer_archive(checkpoint, archive);
  const FlatLayout& layout = flat.layout();
  std::vector<at::Tensor> placeholders;
  auto host = placeholder_optimizer(optim_name(checkpoint.meta.config), layout.parameters().size(),
                                    placeholders);
  try {
    host->load(archive);
  } catch (const c10::OutOfMemoryError&) {
    throw;  // the memory limit: the checkpoint is not damaged
  } catch (const c10::Error& e) {
    throw ResumeError(
        checkpoint.info.path + "/optim.pt does not fit the " +
        std::to_string(layout.parameters().size()) +
        " trainable parameters of the sharded optimizer: " + e.what_without_backtrace());
  }
  int64_t steps = 0;
  bool any = false;
  const ElementRange slice = flat.shard();
  for (const FlatPiece& piece : layout.pieces(slice)) {
    const FlatParameter& fp = layout.parameters()[piece.parameter];
    const auto it = host->state().find(placeholders[piece.parameter].unsafeGetTensorImpl());
    if (it == host->state().end()) continue;  // no step taken for it: zeros
    any = true;
    steps = std::max(steps, libtorch_step(*it->second));
    for (auto& [name, buffer] : staging) {
      if (name == "master") continue;  // from the weights (restore_flat)
      const at::Tensor saved = libtorch_state(*it->second, name);
      if (!saved.defined()) continue;
      if (saved.numel() != fp.numel)
        throw ResumeError(checkpoint.info.path + "/optim.pt: " + fp.name + "'s " + name + " has " +
                          std::to_string(saved.numel()) + " elements, the parameter " +
                          std::to_string(fp.numel));
      buffer.narrow(0, piece.flat_begin - slice.begin, piece.param_range.size())
          .copy_(saved.reshape({-1}).narrow(0, piece.param_range.begin, piece.param_range.size()));
    }
  }
  if (steps < 0) {
    // SGD: its step count only says whether momentum was initialised.
    const int64_t skipped = checkpoint.meta.extra.value("skipped_steps", int64_t{0});
    steps = any ? std::max<int64_t>(1, checkpoint.meta.global_step - skipped) : 0;
  }
  return steps;
}

bool restore_flat(const LoadedCheckpoint& checkpoint, torch::nn::Module& model, FlatOptimizer& flat,
                  int rank) {
  const std::string& where = checkpoint.info.path;
  std::future<NamedTensors> weights = read_weights(checkpoint);
  const FlatLayout& layout = flat.layout();
  const ElementRange slice = flat.shard();
  std::map<std::string, at::Tensor> staging;
  for (const auto& entry : flat.state())
    staging[entry.first] = at::zeros({slice.size()}, at::TensorOptions().dtype(at::kFloat));
  bool master_from_weights = staging.count("master") > 0;
  int64_t steps = 0;
  if (is_sharded(checkpoint)) {
    ShardReader reader(checkpoint);
    const ShardIndex& index = reader.index();
    master_from_weights = master_from_weights && index.state_index("master") < 0;
    for (const FlatPiece& piece : layout.pieces(slice)) {
      const FlatParameter& fp = layout.parameters()[piece.parameter];
      const ShardedParameter* saved = index.parameter(fp.name);
      if (!saved) throw ResumeError(where + " holds no optimizer state of " + fp.name);
      if (saved->shape != fp.shape)
        throw ResumeError(where + ": " + fp.name + " has shape " + c10::str(saved->shape) +
                          " in the checkpoint, the model expects " + c10::str(fp.shape));
      for (auto& [name, buffer] : staging) {
        if (name == "master" && master_from_weights) continue;
        reader.want(fp.name, name, piece.param_range,
                    buffer.data_ptr<float>() + (piece.flat_begin - slice.begin));
      }
    }
    reader.read(/*verify=*/true);
    steps = index.step_count;
  } else {
    steps = slice_libtorch_state(checkpoint, flat, staging);
  }
  const NamedTensors generators = load_checkpoint_tensors(checkpoint, "trainer.pt");
  const NamedTensors saved = weights.get();
  check_weights(saved, model, where);
  if (master_from_weights) {
    // No master in the checkpoint: the fp32 weights it saved (model.pt) are the master.
    std::map<std::string, at::Tensor> by_name(saved.begin(), saved.end());
    at::Tensor& master = staging["master"];
    for (const FlatPiece& piece : layout.pieces(slice)) {
      const FlatParameter& fp = layout.parameters()[piece.parameter];
      const auto it = by_name.find(fp.name);
      if (it == by_name.end()) throw ResumeError(where + "/model.pt has no tensor " + fp.name);
      master.narrow(0, piece.flat_begin - slice.begin, piece.param_range.size())
          .copy_(it->second.reshape({-1}).narrow(0, piece.param_range.begin,
                                                 piece.param_range.size()));
    }
  }
  // Everything is read and checked: now the model, the optimizer and the generators change.
  copy_weights(saved, model);
  {
    at::NoGradGuard no_grad;
    for (auto& [name, live] : flat.state()) live.copy_(staging.at(name));
  }
  flat.set_step_count(steps);
  return restore_generators(generators, model, rank);
}

/// A sharded checkpoint into LibTorch's optimizer (a sharded run resumed with shard none):
/// each parameter's state assembled from the chunks, on the host, then moved to it.
bool restore_replicated_from_shards(const LoadedCheckpoint& checkpoint, torch::nn::Module& model,
                                    optim::Optimizer& optimizer, int rank) {
  const std::string& where = checkpoint.info.path;
  std::future<NamedTensors> weights = read_weights(checkpoint);
  ShardReader reader(checkpoint);
  const ShardIndex& index = reader.index();
  const bool adam =
      dynamic_cast<optim::Adam*>(&optimizer) || dynamic_cast<optim::AdamW*>(&optimizer);
  if (!adam && !dynamic_cast<optim::SGD*>(&optimizer))
    throw ConfigError("checkpoints can restore the state of SGD, Adam and AdamW only");
  std::vector<std::string> states;
  for (const std::string& s : index.states)
    if (s != "master") states.push_back(s);
  const bool master = index.state_index("master") >= 0;
  const auto params = trainable_named(model);
  // per parameter: state name -> host tensor of the parameter's shape
  std::vector<std::map<std::string, at::Tensor>> assembled(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const ShardedParameter* saved = index.parameter(name);
    if (!saved) throw ResumeError(where + " holds no optimizer state of " + name);
    if (saved->shape != p.sizes().vec())
      throw ResumeError(where + ": " + name + " has shape " + c10::str(saved->shape) +
                        " in the checkpoint, the model expects " + c10::str(p.sizes()));
    std::vector<std::string> wanted = states;
    if (master) wanted.push_back("master");
    for (const std::string& s : wanted) {
      if (s != "master" && index.step_count == 0) continue;  // no step: LibTorch has no state
      at::Tensor t = at::empty(p.sizes(), at::TensorOptions().dtype(at::kFloat));
      reader.want(name, s, {0, saved->numel}, t.data_ptr<float>());
      assembled[i][s] = t;
    }
  }
  reader.read(/*verify=*/true);
  const NamedTensors generators = load_checkpoint_tensors(checkpoint, "trainer.pt");
  const NamedTensors saved = weights.get();
  check_weights(saved, model, where);
  copy_weights(saved, model);
  at::NoGradGuard no_grad;
  std::unordered_map<void*, size_t> position;
  for (size_t i = 0; i < params.size(); ++i) {
    position[params[i].second.unsafeGetTensorImpl()] = i;
    // The fp32 master is the weights' exact value; model.pt holds them in 16 bits.
    if (master) params[i].second.copy_(assembled[i]["master"]);
  }
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      void* key = p.unsafeGetTensorImpl();
      const auto it = position.find(key);
      if (it == position.end() || index.step_count == 0) continue;
      auto& a = assembled[it->second];
      const auto to = [&](const std::string& s) { return a.at(s).to(p.device()); };
      if (dynamic_cast<optim::AdamW*>(&optimizer)) {
        auto s = std::make_unique<optim::AdamWParamState>();
        s->step(index.step_count);
        s->exp_avg(to("exp_avg"));
        s->exp_avg_sq(to("exp_avg_sq"));
        optimizer.state()[key] = std::move(s);
      } else if (adam) {
        auto s = std::make_unique<optim::AdamParamState>();
        s->step(index.step_count);
        s->exp_avg(to("exp_avg"));
        s->exp_avg_sq(to("exp_avg_sq"));
        optimizer.state()[key] = std::move(s);
      } else if (a.count("momentum_buffer")) {
        auto s = std::make_unique<optim::SGDParamState>();
        s->momentum_buffer(to("momentum_buffer"));
        optimizer.state()[key] = std::move(s);
      }
    }
  }
  return restore_generators(generators, model, rank);
}

}  // namespace

bool is_sharded(const LoadedCheckpoint& checkpoint) {
  return !checkpoint.meta.sharded_optimizer.is_null();
}

CheckpointSnapshot capture_state(const torch::nn::Module& model, StepOptimizer& optimizer,
                                 CheckpointMeta meta,
                                 const std::vector<NamedTensors>& rank_rng_states,
                                 int64_t* copied_bytes) {
  if (optimizer.replicated())
    return capture_state(model, *optimizer.replicated(), std::move(meta), rank_rng_states,
                         copied_bytes);
  HostStateCopy copy;
  copy.copy(model, trainer_rng_states(model, rank_rng_states));
  HostShardCopy shard;
  shard.copy(*optimizer.flat(), optim_name(meta.config));
  if (copied_bytes) *copied_bytes = copy.copied_bytes() + shard.file_bytes();
  CheckpointSnapshot snapshot;
  snapshot.meta = std::move(meta);
  copy.build(snapshot);
  snapshot.materialize();  // in memory, as the unsharded capture_state()'s
  snapshot.meta.sharded_optimizer = shard.index().to_json();
  snapshot.files.emplace_back(shard.file_name(), shard.bytes());
  return snapshot;
}

bool restore_state(const LoadedCheckpoint& checkpoint, torch::nn::Module& model,
                   StepOptimizer& optimizer, int rank) {
  if (FlatOptimizer* flat = optimizer.flat()) return restore_flat(checkpoint, model, *flat, rank);
  optim::Optimizer& replicated = *optimizer.replicated();
  if (is_sharded(checkpoint))
    return restore_replicated_from_shards(checkpoint, model, replicated, rank);
  return restore_state(checkpoint, model, replicated, rank);
}

}  // namespace gpurun

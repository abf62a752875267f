// The one translation unit that includes <torch/script.h> (TorchScript is heavy to compile).
#include "model/torchscript_model.h"

#include <map>
#include <sstream>

#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/script.h>

#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "util/fs.h"

namespace gpurun {
namespace {

std::string message_of(const std::exception& e) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  return torch_error ? torch_error->what_without_backtrace() : e.what();
}

torch::jit::Module load_module(const std::string& path) {
  try {
    return torch::jit::load(path, c10::Device(c10::kCPU));
  } catch (const std::exception& e) {
    throw ConfigError(
        "model.torchscript: cannot load " + path +
        " as a TorchScript module (torch.jit.script(m).save(path) in Python): " + message_of(e));
  }
}

/// Registers `from`'s own parameters and buffers in `to` (the same tensors, not copies) and
/// mirrors each child module, recursively, so that names and order follow Python's
/// state_dict(); torch::nn::Module refuses dotted names, hence one nn::Module per submodule.
void mirror(const torch::jit::Module& from, torch::nn::Module& to) {
  for (const auto& p : from.named_parameters(/*recurse=*/false))
    to.register_parameter(p.name, p.value, p.value.requires_grad());
  for (const auto& b : from.named_buffers(/*recurse=*/false)) to.register_buffer(b.name, b.value);
  for (const auto& c : from.named_children()) {
    // Named after the scripted class ("BatchNorm1d", "Linear"), as LibTorch names its modules.
    const auto type = c.value.type()->name();
    auto child = std::make_shared<torch::nn::Module>(type ? type->name() : "ScriptedModule");
    mirror(c.value, *child);
    to.register_module(c.name, child);
  }
}

class TorchScriptModel : public SegmentedModel {
 public:
  TorchScriptModel(torch::jit::Module module, std::string path)
      : module_(std::move(module)), path_(std::move(path)) {
    mirror(module_, *this);
  }

  torch::Tensor forward(torch::Tensor x) override {
    c10::IValue out = module_.forward({std::move(x)});
    if (!out.isTensor())
      throw ConfigError("model.torchscript " + path_ + ": forward() must return a Tensor of " +
                        "logits [N, classes], got a " + out.tagKind());
    return out.toTensor();
  }

  void train(bool on = true) override {
    SegmentedModel::train(on);
    module_.train(on);
  }

 private:
  torch::jit::Module module_;
  std::string path_;
};

}  // namespace

std::shared_ptr<SegmentedModel> load_torchscript_model(const std::string& path,
                                                       const std::vector<int64_t>& input_shape,
                                                       int64_t num_classes) {
  torch::jit::setGraphExecutorOptimize(false);  // exact resume: see torchscript.h
  auto model = std::make_shared<TorchScriptModel>(load_module(path), path);
  std::vector<int64_t> shape{2};
  shape.insert(shape.end(), input_shape.begin(), input_shape.end());
  at::Tensor logits;
  try {
    torch::NoGradGuard no_grad;
    model->eval();  // BatchNorm statistics stay untouched, dropout draws no random numbers
    logits = model->forward(at::zeros(shape));
    model->train();
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError("model.torchscript " + path + ": forward() on a batch of shape " +
                      c10::str(at::IntArrayRef(shape)) + " failed: " + message_of(e));
  }
  if (logits.dim() != 2 || logits.size(0) != 2 || logits.size(1) != num_classes)
    throw ConfigError("model.torchscript " + path + ": forward() on a batch of shape " +
                      c10::str(at::IntArrayRef(shape)) + " returned shape " +
                      c10::str(logits.sizes()) + "; gpurun needs logits [2, " +
                      std::to_string(num_classes) + "] for this dataset");
  return model;
}

void save_torchscript_with_weights(const std::string& module_path,
                                   const std::vector<std::pair<std::string, at::Tensor>>& weights,
                                   const std::string& out_path) {
  torch::jit::Module module = load_module(module_path);
  const std::map<std::string, at::Tensor> by_name(weights.begin(), weights.end());
  const auto copy_in = [&](const std::string& name, at::Tensor target) {
    const auto it = by_name.find(name);
    if (it == by_name.end())
      throw ResumeError("the checkpoint has no tensor " + name + " of " + module_path);
    if (it->second.sizes() != target.sizes())
      throw ResumeError("the checkpoint's " + name + " has shape " + c10::str(it->second.sizes()) +
                        ", " + module_path + " has " + c10::str(target.sizes()));
    target.copy_(it->second);
  };
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : module.named_parameters(/*recurse=*/true)) copy_in(p.name, p.value);
    for (const auto& b : module.named_buffers(/*recurse=*/true)) copy_in(b.name, b.value);
  }
  std::ostringstream bytes;
  module.save(bytes);
  fs::replace_file(out_path, bytes.str());
}

}  // namespace gpurun

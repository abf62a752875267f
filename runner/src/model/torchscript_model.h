// TorchScript models: a module exported from Python with torch.jit.script(m).save("model.pt")
// and named in run.yaml (`model.torchscript: model.pt`) is trained like any gpurun model.
//
// The adapter is a SegmentedModel whose forward() runs the scripted module, and whose
// parameters and buffers are the scripted module's own tensors, registered under the same
// dotted names and in the same order as Python's m.state_dict() (own parameters, own buffers,
// then each child's). So the optimizer, the memory meter, model_digest, checkpoints and
// restore see them like a built-in model's, and model.pt loads into the Python module with
// m.load_state_dict(torch.load("model.pt")).
//
// It has no segments: the module is opaque to gpurun, so the planner fits it to the device by
// gradient accumulation only, never activation checkpointing. Its initial weights are those
// saved from Python (train.seed does not re-initialise them). The graph executor's
// optimisations are turned off (torch::jit::setGraphExecutorOptimize(false)), so every op runs
// as in eager mode with LibTorch's autograd: fused or differentiated-by-script graphs would
// appear after a number of warm-up runs that differs between a fresh and a resumed run, and a
// resumed run would no longer be bit-identical to an uninterrupted one.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace gpurun {

class SegmentedModel;

/// Loads the scripted module at `path` (to the CPU) and checks it on a batch of 2 zero
/// samples of `input_shape` in eval mode: its forward must take one tensor and return logits
/// [2, num_classes]. Throws ConfigError naming the file for an unreadable module or a wrong
/// output, with both shapes.
std::shared_ptr<SegmentedModel> load_torchscript_model(const std::string& path,
                                                       const std::vector<int64_t>& input_shape,
                                                       int64_t num_classes);

/// Loads the scripted module at `module_path`, copies `weights` (name -> tensor, the names of
/// state_dict(), as in a checkpoint's model.pt) into its parameters and buffers, and writes it
/// to `out_path` atomically: torch.jit.load(out_path) in Python gives the trained module.
/// Throws ConfigError for an unreadable module, ResumeError when a tensor of the module is
/// missing from `weights` or has another shape (naming it), IoError when writing fails.
void save_torchscript_with_weights(const std::string& module_path,
                                   const std::vector<std::pair<std::string, at::Tensor>>& weights,
                                   const std::string& out_path);

}  // namespace gpurun

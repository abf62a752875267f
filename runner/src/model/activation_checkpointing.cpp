#include "model/activation_checkpointing.h"

#include <optional>
#include <utility>
#include <vector>

#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "gpurun/model.h"
#include "model/autocast_scope.h"
#include "util/rng.h"

namespace gpurun {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Carries the segment from forward to backward inside the autograd context (saved_data only
/// holds IValues; a capsule holds any CustomClassHolder).
struct SegmentHolder : torch::CustomClassHolder {
  SegmentHolder(torch::nn::Sequential s, std::function<void()> p)
      : segment(std::move(s)), prologue(std::move(p)) {}
  torch::nn::Sequential segment;
  std::function<void()> prologue;
};

/// For its lifetime, keeps a copy of every buffer of `module`; then writes the copies back
/// in place (same tensors, so optimizers and state_dict() references stay valid).
class BufferSnapshot {
 public:
  explicit BufferSnapshot(const torch::nn::Module& module) {
    c10::NoGradGuard no_grad;
    for (const auto& buffer : module.buffers(/*recurse=*/true)) {
      buffers_.push_back(buffer);
      copies_.push_back(buffer.clone());
    }
  }
  ~BufferSnapshot() {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(copies_[i]);
  }
  BufferSnapshot(const BufferSnapshot&) = delete;
  BufferSnapshot& operator=(const BufferSnapshot&) = delete;

 private:
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> copies_;
};

/// The autograd node of one checkpointed segment. Its tensor inputs are x (edge 0) and the
/// segment's parameters (edges 1..P), so the parameters get their gradients through this node.
class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  /// Runs under grad mode off (Function::apply sees to it), so nothing but what is saved here
  /// stays alive for backward.
  static at::Tensor forward(AutogradContext* ctx, torch::nn::Sequential segment,
                            const std::function<void()>& prologue, const at::Tensor& x,
                            at::TensorList parameters) {
    ctx->saved_data["segment"] =
        c10::IValue::make_capsule(c10::make_intrusive<SegmentHolder>(segment, prologue));
    ctx->saved_data["cpu_rng"] = rng_state(default_generator(at::kCPU));
    const c10::DeviceType type = x.device().type();
    ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(type);
    ctx->saved_data["autocast_dtype"] =
        static_cast<int64_t>(at::autocast::get_autocast_dtype(type));
    if (x.is_cuda()) ctx->saved_data["device_rng"] = rng_state(default_generator(x.device()));
    variable_list to_save{x};
    to_save.insert(to_save.end(), parameters.begin(), parameters.end());
    ctx->save_for_backward(std::move(to_save));
    if (prologue) prologue();
    return segment->forward(x);
  }

  /// Recomputes the segment from the saved input and RNG states with grad enabled, and
  /// backpropagates `grad_outputs[0]` through the recomputation. Returns one entry per forward
  /// argument: none for the segment and the prologue, d/dx, then d/dparameter for each
  /// parameter.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto capsule = ctx->saved_data["segment"].toCapsule();
    const auto* holder = static_cast<SegmentHolder*>(capsule.get());
    torch::nn::Sequential segment = holder->segment;
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];

    // The leaves of the recomputation: x detached from the outer graph, and the parameters.
    at::Tensor input = x.detach();
    input.requires_grad_(ctx->needs_input_grad(0));
    variable_list wrt;         // what autograd::grad differentiates with respect to
    std::vector<size_t> slot;  // their positions in the returned list
    if (ctx->needs_input_grad(0)) {
      wrt.push_back(input);
      slot.push_back(2);
    }
    for (size_t i = 1; i < saved.size(); ++i) {
      if (!ctx->needs_input_grad(i) || !saved[i].requires_grad()) continue;
      wrt.push_back(saved[i]);
      slot.push_back(i + 2);
    }

    variable_list result(saved.size() + 2);  // [segment, prologue, x, parameters...]
    {
      // Destroyed in reverse order: the buffers are written back after the gradients are
      // computed (BatchNorm's backward saves its running statistics, which a write before
      // would mark as modified), then the generators return to their post-forward states.
      RngGuard cpu_rng(default_generator(at::kCPU), ctx->saved_data["cpu_rng"].toTensor());
      std::optional<RngGuard> device_rng;
      if (x.is_cuda())
        device_rng.emplace(default_generator(x.device()), ctx->saved_data["device_rng"].toTensor());
      BufferSnapshot buffers(*segment);

      c10::AutoGradMode grad_mode(true);
      // The backward pass runs without autocast: recompute under the forward's state.
      AutocastScope autocast(
          x.device().type(), ctx->saved_data["autocast"].toBool(),
          static_cast<c10::ScalarType>(ctx->saved_data["autocast_dtype"].toInt()));
      if (holder->prologue) holder->prologue();
      at::Tensor output = segment->forward(input);
      if (wrt.empty() || !output.requires_grad()) return result;
      variable_list grads =
          torch::autograd::grad({output}, wrt, {grad_outputs[0]}, /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t k = 0; k < grads.size(); ++k) result[slot[k]] = std::move(grads[k]);
    }
    return result;
  }
};

}  // namespace

torch::Tensor checkpointed_forward(torch::nn::Sequential segment, const torch::Tensor& x,
                                   const std::function<void()>& prologue) {
  if (!c10::GradMode::is_enabled()) {
    if (prologue) prologue();
    return segment->forward(x);
  }
  std::vector<at::Tensor> parameters = segment->parameters(/*recurse=*/true);
  return CheckpointFunction::apply(segment, prologue, x, at::TensorList(parameters));
}

void checkpoint_every_segment(SegmentedModel& model, bool on) {
  model.set_checkpointed(on ? std::vector<bool>(model.segments().size(), true)
                            : std::vector<bool>{});
}

}  // namespace gpurun

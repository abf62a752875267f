#include "gpurun/loss.h"

#include <ATen/ops/cross_entropy_loss.h>
#include <c10/util/Exception.h>

namespace gpurun {

namespace {
void check_shapes(const at::Tensor& logits, const at::Tensor& targets) {
  TORCH_CHECK(logits.dim() == targets.dim() + 1 &&
                  logits.sizes().slice(0, targets.dim()) == targets.sizes(),
              "loss: logits ", logits.sizes(), " do not match targets ", targets.sizes(),
              "; expected logits [N, ..., C] for targets [N, ...]");
}
}  // namespace

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  check_shapes(logits, targets);
  if (targets.dim() == 1) return at::cross_entropy_loss(logits, targets);
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

int64_t correct_predictions(const at::Tensor& logits, const at::Tensor& targets) {
  check_shapes(logits, targets);
  return logits.argmax(-1).eq(targets).sum().item<int64_t>();
}

int64_t counted_targets(const at::Tensor& targets) {
  return targets.ne(kIgnoredTarget).sum().item<int64_t>();
}

}  // namespace gpurun

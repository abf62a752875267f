// A scope in which a model is built without its weights, for `gpurun plan --estimate-only`.
//
// LibTorch's modules allocate and initialise their tensors in their constructors, and C++ has
// no default-device context. Inside this scope the Meta dispatch key is added to every
// operator call (c10's thread-local included key set), so the initialisers (normal_, zeros_,
// kaiming_uniform_, ...) run as the meta backend's no-ops: each tensor is allocated but never
// written, so the kernel maps no page of it and a 7B-parameter model costs address space, not
// resident memory. Shapes, dtypes and requires_grad are exact; the values are garbage, so such
// a model may be measured (parameter counts, the memory estimate) but never trained or run until
// every tensor is given storage of its own (set_data) and written (the `hf` model's weights).
#pragma once

#include <c10/core/impl/LocalDispatchKeySet.h>

namespace gpurun {

class WithoutWeights {
 public:
  WithoutWeights() = default;
  WithoutWeights(const WithoutWeights&) = delete;
  WithoutWeights& operator=(const WithoutWeights&) = delete;

 private:
  /// Puts the thread's dispatch key sets back exactly as they were, destroyed after meta_:
  /// IncludeDispatchKeyGuard's removal keeps the Meta backend bit in the included set
  /// (DispatchKeySet's subtraction leaves backend bits alone), which would send every later
  /// CPU operator of the thread to the meta backend.
  c10::impl::ForceDispatchKeyGuard restore_;
  c10::impl::IncludeDispatchKeyGuard meta_{c10::DispatchKey::Meta};
};

}  // namespace gpurun

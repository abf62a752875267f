// model.pt and trainer.pt as a resume reads them (checkpoint/pickle.h): unpickle_tensors() of
// the file's bytes (a zip archive holding data.pkl and one record per tensor storage), then
// every tensor's data read once, as restore_state() copies it into the model. Input: the file.
#include "checkpoint/format/pickle.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  gpurun::fuzz::expect_gpurun_errors([&] {
    for (const auto& [name, tensor] : gpurun::unpickle_tensors(bytes, "model.pt"))
      (void)tensor.clone();
  });
  return 0;
}

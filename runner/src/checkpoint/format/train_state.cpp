#include "checkpoint/format/train_state.h"

#include <ATen/Version.h>
#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize/input-archive.h>

#include <future>
#include <map>
#include <memory>

#include "checkpoint/format/state_copy.h"
#include "checkpoint/format/verified_read.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "util/rng.h"

namespace gpurun {

namespace {

using caffe2::serialize::ReadAdapterInterface;

/// One of a checkpoint's files as a load reads it: the file itself, straight into the tensors'
/// storage and checked against the manifest as it is read (VerifyingFileReader), or the memory
/// probe's bytes.
struct FileSource {
  std::string what;  ///< its path, for messages
  std::shared_ptr<ReadAdapterInterface> reader;
  std::shared_ptr<VerifyingFileReader> file;  ///< null in memory

  FileSource(const LoadedCheckpoint& checkpoint, const std::string& name)
      : what(checkpoint.info.path + "/" + name) {
    if (!checkpoint.files.empty()) {
      const std::string& bytes = checkpoint.file(name);
      reader = std::make_shared<BytesReadAdapter>(bytes);
      return;
    }
    const auto [size, xxh3] = checkpoint.expected(name);
    file = std::make_shared<VerifyingFileReader>(what, size, xxh3);
    reader = file;
  }

  /// After the file's contents are decoded: throws IoError when a read failed (the storage's
  /// fault, not the checkpoint's: nothing is set aside), DamagedCheckpointError when the bytes
  /// are not those of the manifest.
  void verify() const {
    if (file) file->verify();
  }

  NamedTensors unpickle() const {
    NamedTensors tensors;
    try {
      tensors = unpickle_tensors(reader, what);
    } catch (const DamagedCheckpointError&) {
      verify();  // a read error or changed bytes say more than the parser's complaint
      throw;
    }
    verify();
    return tensors;
  }
};

}  // namespace

NamedTensors load_model_tensors(const LoadedCheckpoint& checkpoint) {
  return load_checkpoint_tensors(checkpoint, "model.pt");
}

NamedTensors load_checkpoint_tensors(const LoadedCheckpoint& checkpoint, const std::string& name) {
  return FileSource(checkpoint, name).unpickle();
}

std::string cpu_capability() {
  const std::string config = at::show_config();
  const std::string key = "CPU capability usage: ";
  auto pos = config.find(key);
  if (pos == std::string::npos) return "unknown";
  auto end = config.find('\n', pos);
  return config.substr(pos + key.size(), end - pos - key.size());
}

namespace {
constexpr const char* kCpuRng = "cpu_rng_state";
constexpr const char* kCudaRng = "cuda_rng_state";

/// trainer.pt's key of rank `rank`'s state `name`: rank 0 keeps the plain name, as before
/// distributed runs existed.
std::string rng_key(const std::string& name, int rank) {
  return rank == 0 ? name : name + ".rank" + std::to_string(rank);
}
}  // namespace

c10::Device model_device(const torch::nn::Module& model) {
  const std::vector<at::Tensor> params = model.parameters();
  return params.empty() ? c10::Device(c10::kCPU) : params.front().device();
}

NamedTensors process_rng_states(const c10::Device& device) {
  NamedTensors states{{kCpuRng, rng_state(default_generator(at::kCPU))}};
  if (device.is_cuda()) states.emplace_back(kCudaRng, rng_state(default_generator(device)));
  return states;
}

NamedTensors trainer_rng_states(const torch::nn::Module& model,
                                const std::vector<NamedTensors>& rank_rng_states) {
  NamedTensors trainer = process_rng_states(model_device(model));
  for (size_t r = 0; r < rank_rng_states.size(); ++r)
    for (const auto& [name, state] : rank_rng_states[r])
      trainer.emplace_back(rng_key(name, static_cast<int>(r) + 1), state);
  return trainer;
}

CheckpointSnapshot capture_state(const torch::nn::Module& model,
                                 const torch::optim::Optimizer& optimizer, CheckpointMeta meta,
                                 const std::vector<NamedTensors>& rank_rng_states,
                                 int64_t* copied_bytes) {
  HostStateCopy copy;
  copy.copy(model, optimizer, trainer_rng_states(model, rank_rng_states));
  if (copied_bytes) *copied_bytes = copy.copied_bytes();
  CheckpointSnapshot snapshot;
  snapshot.meta = std::move(meta);
  copy.build(snapshot);
  snapshot.materialize();  // in memory: the copy ends here
  return snapshot;
}

bool restore_state(const LoadedCheckpoint& checkpoint, torch::nn::Module& model,
                   torch::optim::Optimizer& optimizer, int rank) {
  // Every file is read, checked and decoded before anything changes: a file that fails leaves
  // the model, the optimizer and the generators as they were.
  const std::string& where = checkpoint.info.path;
  // model.pt on a second thread while this one reads optim.pt: most of a load is the kernel
  // copying from the page cache into fresh pages, which two cores do in about half the time.
  // The memory probe's checkpoint in memory is decoded on this thread, in one order: the peak
  // it measures must not depend on how two threads' temporary buffers happen to overlap.
  const auto policy = checkpoint.files.empty() ? std::launch::async : std::launch::deferred;
  std::future<NamedTensors> weights =
      std::async(policy, [&checkpoint] { return FileSource(checkpoint, "model.pt").unpickle(); });
  torch::serialize::InputArchive archive;
  load_optimizer_archive(checkpoint, archive);
  const NamedTensors generators = FileSource(checkpoint, "trainer.pt").unpickle();
  const NamedTensors saved = weights.get();
  check_weights(saved, model, where);
  copy_weights(saved, model);
  optimizer.load(archive);
  return restore_generators(generators, model, rank);
}

void load_optimizer_archive(const LoadedCheckpoint& checkpoint,
                            torch::serialize::InputArchive& archive) {
  // To host memory first; optimizer.load() moves the state next to the parameters.
  const FileSource optim(checkpoint, "optim.pt");
  try {
    archive.load_from(
        [&](uint64_t pos, void* buf, size_t n) { return optim.reader->read(pos, buf, n); },
        [&] { return optim.reader->size(); }, at::kCPU);
  } catch (const c10::OutOfMemoryError&) {
    throw;  // the memory limit: the checkpoint is not damaged
  } catch (const c10::Error& e) {
    optim.verify();  // a read error or changed bytes say more than the parser's complaint
    throw DamagedCheckpointError(optim.what +
                                 " is not an optimizer archive: " + e.what_without_backtrace());
  }
  optim.verify();
}

void check_weights(const NamedTensors& saved, const torch::nn::Module& model,
                   const std::string& where) {
  std::map<std::string, at::Tensor> by_name(saved.begin(), saved.end());
  for (const auto& [name, tensor] : state_dict(model)) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw ResumeError(where + "/model.pt has no tensor " + name);
    if (it->second.sizes() != tensor.sizes())
      throw ResumeError(where + "/model.pt: " + name + " has shape " +
                        c10::str(it->second.sizes()) + ", the model expects " +
                        c10::str(tensor.sizes()));
  }
}

void copy_weights(const NamedTensors& saved, torch::nn::Module& model) {
  std::map<std::string, at::Tensor> by_name(saved.begin(), saved.end());
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : state_dict(model)) tensor.copy_(by_name.at(name));
}

bool restore_generators(const NamedTensors& generators, const torch::nn::Module& model, int rank) {
  const c10::Device device = model_device(model);
  bool found_cpu = false;
  for (const auto& [name, tensor] : generators) {
    if (name == rng_key(kCpuRng, rank)) {
      set_rng_state(default_generator(at::kCPU), tensor);
      found_cpu = true;
    } else if (name == rng_key(kCudaRng, rank) && device.is_cuda()) {
      // A CUDA state restores onto this rank's device; a resume on the CPU has no use for it.
      set_rng_state(default_generator(device), tensor);
    }
  }
  return found_cpu;
}

}  // namespace gpurun

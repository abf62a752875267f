// The pickled tensor dicts of model.pt and trainer.pt: the format torch.save writes and
// torch.load reads. In a file of their own, apart from train_state.cpp's model and optimizer
// code, so that the pickle fuzz target (tests/fuzz) compiles only this parser.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include "util/byte_sink.h"

namespace gpurun {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// Pickles `tensors` as a dict (insertion order kept), the format torch.save writes and
/// torch.load reads, into `out` as it goes: the zip archive's headers and directory and the
/// pickle in small pieces, each tensor's record in one piece straight from the tensor's memory
/// (so nothing of the size of the file is held). The tensors must be on the CPU. Rethrows what
/// `out` throws.
void pickle_tensors(const NamedTensors& tensors, const ByteSink& out);

/// pickle_tensors() into bytes in memory.
std::string pickle_tensors(const NamedTensors& tensors);

/// LibTorch's archive writers (caffe2::serialize::PyTorchStreamWriter, and what builds on it:
/// torch::serialize::OutputArchive::save_to) take a writer function; the one given to `write`
/// passes every piece to `out`. Once `out` throws (an IoError of the file), `failed` turns
/// true and the rest of the archive is discarded (`write` may stop early, between records);
/// then that exception is rethrown as it is. LibTorch never sees the failure: its writer would
/// throw again from its destructor and end the process.
using ArchiveWriterFunction = std::function<size_t(const void* data, size_t bytes)>;
void write_archive(
    const ByteSink& out,
    const std::function<void(const ArchiveWriterFunction& writer, const bool& failed)>& write);

/// Inverse of pickle_tensors. Throws DamagedCheckpointError, naming `what` (the file), for bytes
/// that are not such a dict: not a zip archive, no data.pkl, a broken pickle, or a dict whose
/// keys are not strings or whose values are not tensors.
NamedTensors unpickle_tensors(const std::string& bytes, const std::string& what);

/// The archive in `bytes`, which must outlive it, for unpickle_tensors(). Unlike LibTorch's
/// MemoryReadAdapter, which copies whatever lies at the offset asked for, a read beyond the end
/// gets only the bytes there are (none): the offsets come from the zip archive's own
/// directory, which a damaged file fills with anything, and a short read is reported by the
/// archive reader as the file's damage.
class BytesReadAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesReadAdapter(const std::string& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  /// Copies up to `n` bytes from offset `pos` into `buf`; returns how many (0 past the end).
  size_t read(uint64_t pos, void* buf, size_t n, const char* what = "") const override;

 private:
  const std::string& bytes_;
};

/// unpickle_tensors() of the archive `reader` reads (a file read as it is checked, or bytes).
NamedTensors unpickle_tensors(std::shared_ptr<caffe2::serialize::ReadAdapterInterface> reader,
                              const std::string& what);

}  // namespace gpurun

// Hugging Face's safetensors format, read and written (https://github.com/huggingface/safetensors,
// "Format"): an 8-byte little-endian header length N, N bytes of JSON
//   {"NAME": {"dtype": "BF16", "shape": [..], "data_offsets": [BEGIN, END]}, ...,
//    "__metadata__": {"format": "pt", ...}}
// then the tensors' bytes, little-endian and row-major, BEGIN and END counted from the first
// byte after the header. A format beside torch.save's pickle (pickle.h): what Hugging Face
// folders hold, and what `gpurun export --format hf|peft` writes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace gpurun {

/// One tensor of a safetensors header.
struct SafetensorsEntry {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  ///< byte offsets from the start of the data (after the header)
  int64_t numel() const;
};

/// The safetensors dtype word of `dtype` ("F32", "BF16", ...); throws std::invalid_argument for
/// a dtype the format has no word for.
std::string safetensors_dtype(c10::ScalarType dtype);

/// A safetensors file, memory-mapped read-only; its header checked when it is opened, its
/// tensors viewed in place.
class SafetensorsFile {
 public:
  /// Maps `path` and checks its header: a length that fits the file (at most 100 MB, as the
  /// reference reader allows), JSON that is an object of entries with a known dtype, a shape of
  /// integers >= 0 and data_offsets [BEGIN, END] with END - BEGIN = the shape's elements x the
  /// dtype's size, inside the file's data, no two overlapping; __metadata__ a map of strings.
  /// Throws ConfigError naming the file and the tensor for anything else (a file cut short
  /// says so: its last tensors end past its end).
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  ///< bytes of the file
  /// The entries in the order of their data in the file.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  /// The entry named `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// A CPU tensor over the mapping's bytes of `entry` (no copy; valid while this file lives;
  /// read-only: writing to it faults).
  at::Tensor view(const SafetensorsEntry& entry) const;
  /// Drops the pages of `entry` from this process's resident set (madvise MADV_DONTNEED: the
  /// page cache keeps them), so that reading a model tensor by tensor never holds the file.
  void release(const SafetensorsEntry& entry) const;
  /// Asks the kernel to read the pages of `entry` ahead (madvise MADV_WILLNEED), so that a copy
  /// of the tensor before it overlaps the disk's reading of this one.
  void prefetch(const SafetensorsEntry& entry) const;

 private:
  std::string path_;
  int64_t size_ = 0;
  int64_t data_start_ = 0;  ///< 8 + the header's length
  void* map_ = nullptr;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

/// What write_safetensors() writes of one tensor: its name, dtype and shape; its values come
/// later, from `values`.
struct SafetensorsSpec {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
};

/// Writes one safetensors file at `path` (replaced atomically: a temporary file beside it,
/// fsynced, renamed): the header from `specs` and `metadata` (`{"format": "pt"}`, which
/// transformers' loader requires, is added), then each tensor's bytes in the order of `specs`,
/// asked of `values(i)` one at a time, so that only one tensor is held at once. `values(i)` must
/// give a CPU tensor of spec i's dtype and shape. Returns the bytes written. Throws IoError when
/// the file cannot be written, std::invalid_argument when a tensor does not match its spec.
int64_t write_safetensors(const std::string& path, const std::vector<SafetensorsSpec>& specs,
                          const std::function<at::Tensor(size_t index)>& values,
                          const std::map<std::string, std::string>& metadata = {});

}  // namespace gpurun

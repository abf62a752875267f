#include "checkpoint/format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "gpurun/errors.h"
#include "util/fd_io.h"
#include "util/fs.h"

namespace gpurun {
namespace {

using json = nlohmann::json;

/// The reference implementation's limit on the header (safetensors' MAX_HEADER_SIZE).
constexpr int64_t kMaxHeaderBytes = 100'000'000;

const std::vector<std::pair<std::string, c10::ScalarType>>& dtype_words() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> kWords = {
      {"F64", c10::ScalarType::Double},
      {"F32", c10::ScalarType::Float},
      {"F16", c10::ScalarType::Half},
      {"BF16", c10::ScalarType::BFloat16},
      {"I64", c10::ScalarType::Long},
      {"I32", c10::ScalarType::Int},
      {"I16", c10::ScalarType::Short},
      {"I8", c10::ScalarType::Char},
      {"U8", c10::ScalarType::Byte},
      {"BOOL", c10::ScalarType::Bool},
      {"F8_E4M3", c10::ScalarType::Float8_e4m3fn},
      {"F8_E5M2", c10::ScalarType::Float8_e5m2}};
  return kWords;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string safetensors_dtype(c10::ScalarType dtype) {
  for (const auto& [word, type] : dtype_words())
    if (type == dtype) return word;
  throw std::invalid_argument(std::string("safetensors has no dtype for ") + c10::toString(dtype));
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const auto bad = [&](const std::string& why) {
    return ConfigError(path + " is not a valid safetensors file: " + why);
  };
  Fd file;
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd < 0) throw ConfigError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) throw IoError("stat", path, errno);
  if (!S_ISREG(st.st_mode)) throw ConfigError(path + " is not a file");
  size_ = static_cast<int64_t>(st.st_size);
  if (size_ < 8) throw bad("it is " + std::to_string(size_) + " bytes, shorter than its header");
  unsigned char length_bytes[8];
  if (fs::pread_full(file.fd, reinterpret_cast<char*>(length_bytes), 8, 0, path) != 8)
    throw bad("its header's length cannot be read");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | length_bytes[i];
  if (static_cast<int64_t>(length) > size_ - 8)
    throw bad("its header says " + std::to_string(length) + " bytes, and the file holds " +
              std::to_string(size_ - 8) + " after the length (is the file cut short?)");
  if (length > static_cast<uint64_t>(kMaxHeaderBytes))
    throw bad("its header says " + std::to_string(length) + " bytes, more than the " +
              std::to_string(kMaxHeaderBytes) + " the format allows");
  data_start_ = 8 + static_cast<int64_t>(length);
  std::string text(length, '\0');
  if (fs::pread_full(file.fd, text.data(), length, 8, path) != length)
    throw bad("its header cannot be read");
  json header;
  try {
    header = json::parse(text);
  } catch (const std::exception& e) {
    throw bad(std::string("its header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw bad("its header is not a JSON object");
  const int64_t data_bytes = size_ - data_start_;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) throw bad("__metadata__ is not an object");
      for (const auto& [key, text_value] : value.items()) {
        if (!text_value.is_string()) throw bad("__metadata__." + key + " is not a string");
        metadata_[key] = text_value.get<std::string>();
      }
      continue;
    }
    const auto tensor = [&](const std::string& why) { return bad("tensor " + name + ": " + why); };
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets"))
      throw tensor("expected {dtype, shape, data_offsets}, got " + value.dump());
    SafetensorsEntry e;
    e.name = name;
    const json& dtype = value["dtype"];
    const auto word = std::find_if(dtype_words().begin(), dtype_words().end(),
                                   [&](const auto& w) { return dtype == w.first; });
    if (word == dtype_words().end()) throw tensor("unknown dtype " + dtype.dump());
    e.dtype = word->second;
    if (!value["shape"].is_array()) throw tensor("shape is not a list");
    int64_t numel = 1;
    for (const json& d : value["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 48))
        throw tensor("shape " + value["shape"].dump() + " is not a list of sizes");
      e.shape.push_back(d.get<int64_t>());
      numel *= e.shape.back();
      if (numel > (int64_t{1} << 48))
        throw tensor("shape " + value["shape"].dump() + " is too large");
    }
    const json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      throw tensor("data_offsets " + offsets.dump() + " is not [BEGIN, END]");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end) throw tensor("data_offsets " + offsets.dump() + " end before they begin");
    if (end > static_cast<uint64_t>(data_bytes))
      throw tensor("data_offsets " + offsets.dump() + " run past the end of the file's " +
                   std::to_string(data_bytes) + " bytes of data (is the file cut short? it is " +
                   std::to_string(size_) + " bytes)");
    e.begin = static_cast<int64_t>(begin);
    e.end = static_cast<int64_t>(end);
    const int64_t want = numel * static_cast<int64_t>(c10::elementSize(e.dtype));
    if (e.end - e.begin != want)
      throw tensor("data_offsets " + offsets.dump() + " hold " + std::to_string(e.end - e.begin) +
                   " bytes; its dtype " + dtype.get<std::string>() + " and shape " +
                   value["shape"].dump() + " take " + std::to_string(want));
    entries_.push_back(std::move(e));
  }
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (i > 0 && entries_[i].begin < entries_[i - 1].end)
      throw bad("tensors " + entries_[i - 1].name + " and " + entries_[i].name + " overlap");
    by_name_[entries_[i].name] = i;
  }
  if (size_ > 0) {
    map_ = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_PRIVATE, file.fd, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      throw IoError("mmap", path, errno);
    }
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, static_cast<size_t>(size_));
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

at::Tensor SafetensorsFile::view(const SafetensorsEntry& entry) const {
  char* data = static_cast<char*>(map_) + data_start_ + entry.begin;
  return at::from_blob(data, entry.shape, at::TensorOptions().dtype(entry.dtype));
}

void SafetensorsFile::release(const SafetensorsEntry& entry) const {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  // Whole pages inside the tensor's bytes only: a page it shares with a neighbour stays.
  const int64_t first = (data_start_ + entry.begin + page - 1) / page * page;
  const int64_t last = (data_start_ + entry.end) / page * page;
  if (last > first)
    ::madvise(static_cast<char*>(map_) + first, static_cast<size_t>(last - first), MADV_DONTNEED);
}

void SafetensorsFile::prefetch(const SafetensorsEntry& entry) const {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t first = (data_start_ + entry.begin) / page * page;
  const int64_t end = data_start_ + entry.end;
  if (end > first)
    ::madvise(static_cast<char*>(map_) + first, static_cast<size_t>(end - first), MADV_WILLNEED);
}

int64_t write_safetensors(const std::string& path, const std::vector<SafetensorsSpec>& specs,
                          const std::function<at::Tensor(size_t index)>& values,
                          const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  json meta = json::object();
  for (const auto& [key, value] : metadata) meta[key] = value;
  if (!meta.contains("format")) meta["format"] = "pt";
  header["__metadata__"] = meta;
  int64_t offset = 0;
  for (const SafetensorsSpec& s : specs) {
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(s.dtype));
    header[s.name] = {{"dtype", safetensors_dtype(s.dtype)},
                      {"shape", s.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // The data starts 8-byte aligned, as the reference writer pads the header with spaces.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  uint64_t length = text.size();
  for (int i = 0; i < 8; ++i)
    prefix[static_cast<size_t>(i)] = static_cast<char>((length >> (8 * i)) & 0xff);
  prefix += text;

  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  Fd out;
  out.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out.fd < 0) throw IoError("create", tmp, errno);
  try {
    fs::write_all(out.fd, prefix.data(), prefix.size(), tmp);
    for (size_t i = 0; i < specs.size(); ++i) {
      at::Tensor t = values(i);
      if (!t.device().is_cpu() || t.scalar_type() != specs[i].dtype ||
          t.sizes().vec() != specs[i].shape)
        throw std::invalid_argument("write_safetensors: the values of " + specs[i].name +
                                    " do not match its dtype and shape");
      t = t.contiguous();
      fs::write_all(out.fd, static_cast<const char*>(t.data_ptr()), t.nbytes(), tmp);
    }
    if (::fsync(out.fd) != 0) throw IoError("fsync", tmp, errno);
    fs::rename_durable(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  return static_cast<int64_t>(prefix.size()) + offset;
}

}  // namespace gpurun

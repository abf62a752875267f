#include "checkpoint/pickle.h"

#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <exception>
#include <functional>
#include <string_view>
#include <unordered_map>

#include "gpurun/errors.h"

namespace gpurun {

namespace {

/// The dtypes of weights, buffers and generator states: those a resume can copy into a model
/// (at::Tensor::copy_). A pickle may name any storage type, also ones copy_() has no kernel
/// for (UInt7, the bit and quantized types), whose c10::Error would name neither file nor
/// tensor, and would not let the resume fall back to the previous checkpoint.
bool loadable(at::ScalarType type) {
  switch (type) {
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kHalf:
    case at::kFloat:
    case at::kDouble:
    case at::kBFloat16:
    case at::kBool:
    case at::kComplexFloat:
    case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

/// Empty when every element of `t` lies inside the `storage_bytes` its storage really holds;
/// else why not. The sizes, strides and offset come from the pickle, and so does the size the
/// storage claims (its element count); the bytes behind it are the archive's record. A damaged
/// file may make them disagree, and a copy would then read past the record.
std::string outside_storage(const at::Tensor& t, size_t storage_bytes) {
  if (t.numel() == 0) return "";
  // Element offsets of the first and last element, without overflow (__int128 holds any sum
  // of products of two int64 values over a tensor's dimensions).
  __int128 lo = t.storage_offset(), hi = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    const __int128 span = static_cast<__int128>(t.size(d) - 1) * t.stride(d);
    (span < 0 ? lo : hi) += span;
  }
  const __int128 needed = (hi + 1) * static_cast<__int128>(t.element_size());
  if (lo >= 0 && needed <= static_cast<__int128>(storage_bytes)) return "";
  return "sizes " + c10::str(t.sizes()) + ", strides " + c10::str(t.strides()) + " and offset " +
         std::to_string(t.storage_offset()) + " reach outside its storage of " +
         std::to_string(storage_bytes) + " bytes";
}

/// The arguments that follow an opcode of pickle protocols 0 to 5.
struct OpcodeShape {
  bool known = true;  ///< false: not an opcode
  size_t fixed = 0;   ///< bytes of a fixed-size argument
  size_t prefix = 0;  ///< bytes of the length before a counted argument
  int lines = 0;      ///< newline-terminated arguments
};

OpcodeShape opcode_shape(unsigned char op) {
  OpcodeShape s;
  switch (op) {
    case 'K':
    case 'q':
    case 'h':
    case 0x80:
    case 0x82:  // BININT1 BINPUT BINGET PROTO EXT1
      s.fixed = 1;
      break;
    case 'M':
    case 0x83:  // BININT2 EXT2
      s.fixed = 2;
      break;
    case 'J':
    case 'r':
    case 'j':
    case 0x84:  // BININT LONG_BINPUT LONG_BINGET EXT4
      s.fixed = 4;
      break;
    case 'G':
    case 0x95:  // BINFLOAT FRAME
      s.fixed = 8;
      break;
    case 'U':
    case 'C':
    case 0x8c:
    case 0x8a:  // SHORT_BINSTRING/BINBYTES/BINUNICODE LONG1
      s.prefix = 1;
      break;
    case 'T':
    case 'B':
    case 'X':
    case 0x8b:  // BINSTRING BINBYTES BINUNICODE LONG4
      s.prefix = 4;
      break;
    case 0x8d:
    case 0x8e:
    case 0x96:  // BINUNICODE8 BINBYTES8 BYTEARRAY8
      s.prefix = 8;
      break;
    case 'I':
    case 'L':
    case 'F':
    case 'S':
    case 'V':
    case 'p':
    case 'g':
    case 'P':
      s.lines = 1;  // INT LONG FLOAT STRING UNICODE PUT GET PERSID
      break;
    case 'c':
    case 'i':  // GLOBAL INST
      s.lines = 2;
      break;
    case '(':
    case '0':
    case '1':
    case '2':
    case 'N':
    case 'R':
    case 'a':
    case 'b':
    case 'd':
    case '}':
    case 'e':
    case 'l':
    case ']':
    case 'o':
    case 's':
    case 't':
    case ')':
    case 'u':
    case 'Q':
    case 0x81:
    case 0x85:
    case 0x86:
    case 0x87:
    case 0x88:
    case 0x89:
    case 0x8f:
    case 0x90:
    case 0x91:
    case 0x92:
    case 0x93:
    case 0x97:
    case 0x98:
      break;    // no argument
    case 0x94:  // MEMOIZE
    case '.':   // STOP
      break;
    default:
      s.known = false;
  }
  return s;
}

/// Why the pickle `p` (`n` bytes) must not reach LibTorch's unpickler, or "". The unpickler
/// believes two numbers of the file: the memo index of a PUT, to which it resizes its memo
/// table (16 bytes an entry, all written: four bytes of a damaged file made it fill 64 GiB), and
/// the length of a string or bytes argument, which it reserves before it reads (1.7 GB for a
/// 369-byte pickle). Picklers (Python's, LibTorch's) number memo entries 0, 1, 2, ...: an index
/// may name an entry again, never skip ahead; and an argument lies within the pickle. The walk
/// knows every opcode of pickle protocols 0 to 5 and leaves what it cannot walk (an unknown
/// opcode, a truncated fixed-size argument) to the unpickler, which rejects it.
std::string pickle_problem(const char* p, size_t n) {
  uint64_t entries = 0;
  const auto put = [&](uint64_t index, size_t at) -> std::string {
    if (index > entries)
      return "its pickle stores memo entry " + std::to_string(index) + " at byte " +
             std::to_string(at) + " after only " + std::to_string(entries);
    if (index == entries) ++entries;
    return "";
  };
  const auto little_endian = [&](size_t at, size_t bytes) {
    uint64_t v = 0;
    for (size_t k = bytes; k-- > 0;) v = (v << 8) | static_cast<unsigned char>(p[at + k]);
    return v;
  };
  const auto line_end = [&](size_t from) {
    const void* nl = std::memchr(p + from, '\n', n - from);
    return nl ? static_cast<size_t>(static_cast<const char*>(nl) - p) : n;
  };
  size_t i = 0;
  while (i < n) {
    const size_t at = i;
    const unsigned char op = static_cast<unsigned char>(p[i++]);
    if (op == '.') return "";   // STOP
    if (op == 0x94) ++entries;  // MEMOIZE: the next entry
    const OpcodeShape shape = opcode_shape(op);
    if (!shape.known) return "";  // not an opcode: the unpickler says so
    const size_t fixed = shape.fixed, prefix = shape.prefix;
    const int lines = shape.lines;
    if (fixed > 0) {
      if (n - i < fixed) return "";
      if (op == 'q' || op == 'r') {  // BINPUT, LONG_BINPUT
        if (std::string problem = put(little_endian(i, fixed), at); !problem.empty())
          return problem;
      }
      i += fixed;
    } else if (prefix > 0) {
      if (n - i < prefix) return "";
      const uint64_t length = little_endian(i, prefix);
      i += prefix;
      if (length > n - i)
        return "its pickle's argument at byte " + std::to_string(at) + " claims " +
               std::to_string(length) + " bytes, " + std::to_string(n - i) + " follow";
      i += static_cast<size_t>(length);
    }
    for (int k = 0; k < lines; ++k) {
      const size_t end = line_end(i);
      if (end == n) return "";
      if (op == 'p') {  // PUT: a decimal index
        uint64_t index = 0;
        const auto [ptr, ec] = std::from_chars(p + i, p + end, index);
        if (ec != std::errc() || ptr != p + end)
          return "its pickle stores a memo entry of no valid index at byte " + std::to_string(at);
        if (std::string problem = put(index, at); !problem.empty()) return problem;
      }
      i = end + 1;
    }
  }
  return "";
}

/// How an opcode changes the depth of the unpickler's stack, a MARK counting as one element;
/// for the opcodes that pop down to the last MARK, `to_mark` and what they push afterwards.
struct StackEffect {
  bool known = true;
  int change = 0;        ///< without to_mark
  bool to_mark = false;  ///< pops down to the last MARK, the MARK included
  int pushed = 0;        ///< with to_mark: what it pushes afterwards
};

StackEffect stack_effect(unsigned char op) {
  switch (op) {
    case '(':  // MARK
    case '}':
    case ']':
    case ')':
    case 'N':
    case 0x88:
    case 0x89:  // empty containers, None, bools
    case 'K':
    case 'M':
    case 'J':
    case 'G':
    case 'I':
    case 'L':
    case 'F':
    case 0x8a:
    case 0x8b:
    case 'X':
    case 'V':
    case 'S':
    case 'T':
    case 'U':
    case 'B':
    case 'C':
    case 0x8c:
    case 0x8d:
    case 0x8e:
    case 'c':
    case 'h':
    case 'j':
    case 'g':
    case 'P':
      return {true, 1};
    case 'q':
    case 'r':
    case 'p':
    case 0x94:
    case 'Q':
    case 0x85:
    case 0x80:
    case 0x95:
    case '.':
      return {true, 0};
    case 'R':
    case 'a':
    case 'b':
    case '0':
    case 0x86:
    case 0x93:
      return {true, -1};
    case 's':
    case 0x87:
      return {true, -2};
    case 'u':
    case 'e':
      return {true, 0, true, 0};  // into the container below the MARK
    case 't':
    case 'l':
    case 'd':
      return {true, 0, true, 1};
    default:
      return {false};
  }
}

/// A Python state_dict's pickle, with its OrderedDicts as plain dicts: LibTorch's unpickler
/// turns `collections.OrderedDict()` into None (it expects one only as a tensor's empty
/// backward hooks) and has no BUILD for a dict, so `torch.save(model.state_dict(), f)`, the
/// common way to save weights, would not load. Each construction of an OrderedDict with no
/// arguments (GLOBAL or BINGET of the class, EMPTY_TUPLE, REDUCE) becomes EMPTY_DICT (the class
/// itself an empty dict in its memo entry), and each BUILD is dropped with its argument (the
/// `_metadata` attribute that PyTorch sets on a state_dict: it says which module version wrote
/// each entry, nothing a name -> tensor dict keeps). Returns `pkl` unchanged when it holds
/// something else it cannot rewrite, which the unpickler then refuses. Call only on a pickle
/// that pickle_problem() accepted: every argument lies inside it.
std::string without_ordered_dicts(const std::string& pkl) {
  struct Op {
    unsigned char code;
    size_t at, end;
  };
  std::vector<Op> ops;
  for (size_t i = 0; i < pkl.size();) {
    const size_t at = i;
    const auto code = static_cast<unsigned char>(pkl[i++]);
    const OpcodeShape shape = opcode_shape(code);
    if (!shape.known) return pkl;
    // pickle_problem() leaves a truncated argument to the unpickler: so does this.
    if (shape.fixed + shape.prefix > pkl.size() - i) return pkl;
    i += shape.fixed;
    if (shape.prefix > 0) {
      uint64_t length = 0;
      for (size_t k = shape.prefix; k-- > 0;)
        length = (length << 8) | static_cast<unsigned char>(pkl[i + k]);
      i += shape.prefix;
      if (length > pkl.size() - i) return pkl;
      i += static_cast<size_t>(length);
    }
    for (int k = 0; k < shape.lines; ++k) i = pkl.find('\n', i) + 1;
    if (i == 0 || i > pkl.size()) return pkl;
    ops.push_back({code, at, i});
    if (code == '.') break;
  }
  const auto argument = [&](const Op& op) {
    uint64_t v = 0;
    for (size_t k = op.end - op.at - 1; k-- > 0;)
      v = (v << 8) | static_cast<unsigned char>(pkl[op.at + 1 + k]);
    return v;
  };
  // The stack depth before each op, to find where a BUILD's argument starts.
  std::vector<int> depth(ops.size() + 1, 0);
  std::vector<int> marks;
  for (size_t k = 0; k < ops.size(); ++k) {
    const StackEffect e = stack_effect(ops[k].code);
    if (!e.known) return pkl;
    int d = depth[k];
    if (e.to_mark) {
      if (marks.empty()) return pkl;
      d = marks.back() + e.pushed;
      marks.pop_back();
    } else {
      if (ops[k].code == '(') marks.push_back(d);
      d += e.change;
    }
    if (d < 0) return pkl;
    depth[k + 1] = d;
  }
  std::vector<bool> drop(ops.size(), false);
  for (size_t k = 0; k < ops.size(); ++k) {
    if (ops[k].code != 'b') continue;
    size_t first = k;  // the argument: the ops since the stack was one element lower
    while (first > 0 && depth[first] >= depth[k]) --first;
    if (depth[first] != depth[k] - 1) return pkl;
    for (size_t j = first; j <= k; ++j) drop[j] = true;
  }
  // A memo entry made inside a dropped argument must not be read afterwards.
  std::vector<uint64_t> dropped_slots, class_slots;
  std::string out;
  for (size_t k = 0; k < ops.size(); ++k) {
    const Op& op = ops[k];
    const bool put = op.code == 'q' || op.code == 'r';
    const bool get = op.code == 'h' || op.code == 'j';
    if (drop[k]) {
      if (put) dropped_slots.push_back(argument(op));
      if (op.code == 'p' || op.code == 0x94) return pkl;
      continue;
    }
    const auto in = [&](const std::vector<uint64_t>& slots) {
      return std::find(slots.begin(), slots.end(), argument(op)) != slots.end();
    };
    if (get && in(dropped_slots)) return pkl;
    const bool global = op.code == 'c' && pkl.compare(op.at + 1, op.end - op.at - 1,
                                                      "collections\nOrderedDict\n") == 0;
    if (global || (get && in(class_slots))) {
      out += '}';
      size_t next = k + 1;
      if (global && next < ops.size() && (ops[next].code == 'q' || ops[next].code == 'r')) {
        class_slots.push_back(argument(ops[next]));
        out.append(pkl, ops[next].at, ops[next].end - ops[next].at);
        ++next;
      }
      if (next + 1 >= ops.size() || ops[next].code != ')' || ops[next + 1].code != 'R')
        return pkl;  // an OrderedDict built from arguments
      k = next + 1;
      continue;
    }
    out.append(pkl, op.at, op.end - op.at);
  }
  return out;
}

}  // namespace

void write_archive(
    const ByteSink& out,
    const std::function<void(const ArchiveWriterFunction& writer, const bool& failed)>& write) {
  // LibTorch calls the writer function from inside miniz (C), and a PyTorchStreamWriter that
  // once saw a short write throws again from its destructor (its writeEndOfFile), which
  // std::terminate()s an unwinding process. So the writer never learns of the failure: the rest
  // of the archive is discarded, and the sink's exception rethrown once the writer is done.
  std::exception_ptr error;
  bool failed = false;
  const ArchiveWriterFunction writer = [&](const void* data, size_t size) -> size_t {
    if (failed) return size;
    try {
      out(static_cast<const char*>(data), size);
    } catch (...) {
      error = std::current_exception();
      failed = true;
    }
    return size;
  };
  write(writer, failed);
  if (failed) std::rethrow_exception(error);
}

void pickle_tensors(const NamedTensors& tensors, const ByteSink& out) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor);
  // torch::jit::pickle_save() with one difference: no type tags. A tagged dict is pickled as a
  // call to torch.jit._pickle.restore_type_tag, which torch.load's default weights_only=True
  // (PyTorch >= 2.6) refuses; untagged, the file holds only a dict, strings and tensors.
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) { pickled.insert(pickled.end(), data, data + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  write_archive(out, [&](const ArchiveWriterFunction& writer, const bool& failed) {
    caffe2::serialize::PyTorchStreamWriter archive(writer);
    // torch::jit::writeArchiveAndTensors(), but for the stop after a failed write: the records
    // data/0, data/1, ... each written from the tensor's own storage
    // (getWriteableTensorData() copies only a device's tensor), then data.pkl.
    size_t i = 0;
    for (const at::Tensor& tensor : pickler.tensorData()) {
      if (failed) break;
      const torch::jit::WriteableTensorData record = torch::jit::getWriteableTensorData(tensor);
      archive.writeRecord("data/" + std::to_string(i++), record.data(), record.sizeInBytes());
    }
    if (!failed) archive.writeRecord("data.pkl", pickled.data(), pickled.size());
    archive.writeEndOfFile();
  });
}

std::string pickle_tensors(const NamedTensors& tensors) {
  std::string archive;
  pickle_tensors(tensors, [&](const char* data, size_t size) { archive.append(data, size); });
  return archive;
}

NamedTensors unpickle_tensors(std::shared_ptr<caffe2::serialize::ReadAdapterInterface> reader,
                              const std::string& what) {
  c10::IValue value;
  std::string problem;
  // The bytes each storage's record really holds, by its data pointer: LibTorch's unpickler
  // sizes a storage by the element count the pickle names, over whatever its record holds.
  std::unordered_map<const void*, size_t> record_bytes;
  try {
    caffe2::serialize::PyTorchStreamReader archive(std::move(reader));
    if (!archive.hasRecord("data.pkl")) {
      problem = "it has no data.pkl";
    } else {
      const auto [pickle, size] = archive.getRecord("data.pkl");
      const char* bytes = static_cast<const char*>(pickle.get());
      problem = pickle_problem(bytes, size);
      // A Python state_dict's pickle is rewritten: see without_ordered_dicts().
      const std::string data =
          problem.empty() && std::string_view(bytes, size).find("collections\nOrderedDict\n") !=
                                 std::string_view::npos
              ? without_ordered_dicts(std::string(bytes, size))
              : std::string(bytes, size);
      if (problem.empty()) {
        // torch::jit::readArchiveAndTensors() but for the record sizes kept.
        size_t offset = 0;
        torch::jit::Unpickler unpickler(
            [&](char* buf, size_t n) {
              const size_t count = std::min(n, data.size() - offset);
              if (count > 0) std::memcpy(buf, data.data() + offset, count);
              offset += count;
              return count;
            },
            /*type_resolver=*/nullptr, /*obj_loader=*/nullptr,
            [&](const std::string& name) {
              auto [record, record_size] = archive.getRecord("data/" + name);
              record_bytes[record.get()] = record_size;
              return std::move(record);
            },
            std::nullopt);
        unpickler.set_version(archive.version());
        value = unpickler.parse_ivalue();
      }
    }
  } catch (const c10::Error& e) {  // LibTorch's own: without its C++ backtrace
    throw DamagedCheckpointError(what +
                                 " is not a pickled tensor dict: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw DamagedCheckpointError(what + " is not a pickled tensor dict: " + e.what());
  }
  if (!problem.empty())
    throw DamagedCheckpointError(what + " is not a pickled tensor dict: " + problem);
  if (!value.isGenericDict()) throw DamagedCheckpointError(what + " is not a pickled tensor dict");
  NamedTensors out;
  for (const auto& entry : value.toGenericDict()) {
    // toStringRef() and toTensor() of anything else would throw c10::Error, which names
    // neither the file nor the entry.
    if (!entry.key().isString())
      throw DamagedCheckpointError(what + " is not a pickled tensor dict: a key is a " +
                                   entry.key().tagKind() + ", not a string");
    if (!entry.value().isTensor())
      throw DamagedCheckpointError(what +
                                   " is not a pickled tensor dict: " + entry.key().toStringRef() +
                                   " is a " + entry.value().tagKind() + ", not a tensor");
    const at::Tensor tensor = entry.value().toTensor();
    if (!loadable(tensor.scalar_type()))
      throw DamagedCheckpointError(what + ": tensor " + entry.key().toStringRef() + " has dtype " +
                                   c10::toString(tensor.scalar_type()) +
                                   ", which no gpurun checkpoint holds");
    const auto record = record_bytes.find(tensor.storage().data());
    const size_t storage_bytes = record == record_bytes.end()
                                     ? tensor.storage().nbytes()
                                     : std::min<size_t>(tensor.storage().nbytes(), record->second);
    if (const std::string outside = outside_storage(tensor, storage_bytes); !outside.empty())
      throw DamagedCheckpointError(what + ": tensor " + entry.key().toStringRef() + ": " + outside);
    out.emplace_back(entry.key().toStringRef(), tensor);
  }
  return out;
}

size_t BytesReadAdapter::read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const {
  if (pos >= bytes_.size()) return 0;
  const size_t count = std::min<uint64_t>(n, bytes_.size() - pos);
  // A storage of zero bytes is read into a null buffer: memcpy must not see it, even for 0.
  if (count > 0) std::memcpy(buf, bytes_.data() + pos, count);
  return count;
}

NamedTensors unpickle_tensors(const std::string& bytes, const std::string& what) {
  return unpickle_tensors(std::make_shared<BytesReadAdapter>(bytes), what);
}

}  // namespace gpurun

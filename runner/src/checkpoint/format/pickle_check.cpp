#include "checkpoint/format/pickle_check.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <system_error>
#include <vector>

namespace gpurun {

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace gpurun

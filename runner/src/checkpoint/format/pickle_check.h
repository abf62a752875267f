// The checks a pickle passes before LibTorch's unpickler sees it, and the rewrite that lets a
// Python state_dict's pickle through. Apart from pickle.cpp's reading and writing: a walk of
// the opcodes of pickle protocols 0 to 5, with no LibTorch in it.
#pragma once

#include <cstddef>
#include <string>

namespace gpurun {

/// Why the pickle `p` (`n` bytes) must not reach LibTorch's unpickler, or "". The unpickler
/// believes two numbers of the file: the memo index of a PUT, to which it resizes its memo
/// table (16 bytes an entry, all written: four bytes of a damaged file made it fill 64 GiB), and
/// the length of a string or bytes argument, which it reserves before it reads (1.7 GB for a
/// 369-byte pickle). Picklers (Python's, LibTorch's) number memo entries 0, 1, 2, ...: an index
/// may name an entry again, never skip ahead; and an argument lies within the pickle. The walk
/// knows every opcode of pickle protocols 0 to 5 and leaves what it cannot walk (an unknown
/// opcode, a truncated fixed-size argument) to the unpickler, which rejects it.
std::string pickle_problem(const char* p, size_t n);

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
std::string without_ordered_dicts(const std::string& pkl);

}  // namespace gpurun

#include "checkpoint/format/shard_index.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <stdexcept>

namespace gpurun {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument(std::string(kShardedOptimizerKey) + ": " + what);
}

template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) bad(where + "no " + key);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    bad(where + key + " has the wrong type (" + it->type_name() + ")");
  }
}

}  // namespace

std::string shard_file_name(int64_t rank, int64_t world_size) {
  char name[64];
  std::snprintf(name, sizeof name, "optim-shard-%05lld-of-%05lld.bin", static_cast<long long>(rank),
                static_cast<long long>(world_size));
  return name;
}

int64_t ShardIndex::state_index(const std::string& name) const {
  const auto it = std::find(states.begin(), states.end(), name);
  return it == states.end() ? -1 : it - states.begin();
}

const ShardedParameter* ShardIndex::parameter(const std::string& name) const {
  for (const ShardedParameter& p : parameters)
    if (p.name == name) return &p;
  return nullptr;
}

json ShardIndex::to_json() const {
  json params = json::array();
  for (const ShardedParameter& p : parameters) {
    json chunks = json::array();
    for (const ShardChunk& c : p.chunks)
      chunks.push_back({c.file, c.range.begin, c.range.end, c.byte_offset});
    params.push_back(
        {{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"chunks", chunks}});
  }
  return {{"format", "flat-fp32-le"},
          {"optimizer", optimizer},
          {"world_size", world_size},
          {"step_count", step_count},
          {"padded_numel", padded_numel},
          {"shard_numel", shard_numel},
          {"states", states},
          {"files", files},
          {"parameters", params}};
}

ShardIndex ShardIndex::from_json(const json& j) {
  if (!j.is_object()) bad("not an object");
  ShardIndex index;
  if (field<std::string>(j, "format", "") != "flat-fp32-le")
    bad("format " + j["format"].dump() + " is not flat-fp32-le");
  index.optimizer = field<std::string>(j, "optimizer", "");
  index.world_size = field<int64_t>(j, "world_size", "");
  index.step_count = field<int64_t>(j, "step_count", "");
  index.padded_numel = field<int64_t>(j, "padded_numel", "");
  index.shard_numel = field<int64_t>(j, "shard_numel", "");
  index.states = field<std::vector<std::string>>(j, "states", "");
  index.files = field<std::vector<std::string>>(j, "files", "");
  if (index.world_size < 1 || index.shard_numel < 0 || index.step_count < 0)
    bad("world_size, shard_numel or step_count out of range");
  if (std::set<std::string>(index.files.begin(), index.files.end()).size() != index.files.size())
    bad("a file is named twice");
  if (std::set<std::string>(index.states.begin(), index.states.end()).size() != index.states.size())
    bad("a state is named twice");
  const json params = field<json>(j, "parameters", "");
  if (!params.is_array()) bad("parameters is not an array");
  std::set<std::string> names;
  for (const json& pj : params) {
    if (!pj.is_object()) bad("a parameter is not an object");
    ShardedParameter p;
    p.name = field<std::string>(pj, "name", "a parameter: ");
    const std::string where = "parameter " + p.name + ": ";
    if (!names.insert(p.name).second) bad(where + "named twice");
    p.shape = field<std::vector<int64_t>>(pj, "shape", where);
    p.offset = field<int64_t>(pj, "offset", where);
    p.numel = 1;
    for (const int64_t d : p.shape) {
      if (d < 0 || (d > 0 && p.numel > (int64_t{1} << 50) / d)) bad(where + "bad shape");
      p.numel *= d;
    }
    const auto chunks = field<std::vector<std::vector<int64_t>>>(pj, "chunks", where);
    int64_t next = 0;  // the chunks tile [0, numel) in order
    for (const auto& c : chunks) {
      if (c.size() != 4) bad(where + "a chunk is not [file, begin, end, byte_offset]");
      if (c[0] < 0 || c[0] >= static_cast<int64_t>(index.files.size()))
        bad(where + "a chunk names file " + std::to_string(c[0]) + " of " +
            std::to_string(index.files.size()));
      if (c[1] != next || c[2] <= c[1] || c[2] > p.numel || c[3] < 0)
        bad(where + "chunk [" + std::to_string(c[1]) + ", " + std::to_string(c[2]) +
            ") does not continue the chunks before it at element " + std::to_string(next));
      p.chunks.push_back({static_cast<size_t>(c[0]), {c[1], c[2]}, c[3]});
      next = c[2];
    }
    if (next != p.numel)
      bad(where + "the chunks hold " + std::to_string(next) + " of its " + std::to_string(p.numel) +
          " elements");
    index.parameters.push_back(std::move(p));
  }
  return index;
}

ShardIndex make_shard_index(const FlatLayout& layout, const std::string& optimizer,
                            const std::vector<std::string>& states, int64_t step_count) {
  ShardIndex index;
  index.optimizer = optimizer;
  index.world_size = layout.world_size();
  index.step_count = step_count;
  index.padded_numel = layout.padded_numel();
  index.shard_numel = layout.shard_numel();
  index.states = states;
  for (int64_t r = 0; r < layout.world_size(); ++r)
    index.files.push_back(shard_file_name(r, layout.world_size()));
  for (const FlatParameter& fp : layout.parameters())
    index.parameters.push_back({fp.name, fp.shape, fp.numel, fp.offset, {}});
  for (int64_t r = 0; r < layout.world_size(); ++r) {
    const ElementRange slice = layout.shard(r);
    for (const FlatPiece& piece : layout.pieces(slice))
      index.parameters[piece.parameter].chunks.push_back(
          {static_cast<size_t>(r), piece.param_range, (piece.flat_begin - slice.begin) * 4});
  }
  return index;
}

std::string check_sharded_manifest(const json& manifest) {
  const auto member = manifest.find(kShardedOptimizerKey);
  const json version = manifest.value("format_version", json());
  if (member == manifest.end()) {
    if (version.is_number_integer() && version.get<int64_t>() >= kShardedFormatVersion)
      return std::string("manifest.json: format_version 3 without ") + kShardedOptimizerKey;
    return "";
  }
  try {
    const ShardIndex index = ShardIndex::from_json(*member);
    const json files = manifest.value("files", json::object());
    std::vector<int64_t> sizes;
    for (const std::string& name : index.files) {
      const auto entry = files.find(name);
      if (entry == files.end() || !entry->is_object() || !entry->contains("bytes") ||
          !(*entry)["bytes"].is_number_integer())
        return "manifest.json: shard file " + name + " is not in its files table";
      sizes.push_back((*entry)["bytes"].get<int64_t>());
    }
    const int64_t states_bytes =
        static_cast<int64_t>(index.states.size() - (index.states.empty() ? 0 : 1)) *
        index.section_bytes();
    // Without a state (SGD without momentum, no master) the files are empty: nothing to hold.
    for (const ShardedParameter& p :
         index.states.empty() ? std::vector<ShardedParameter>{} : index.parameters)
      for (const ShardChunk& c : p.chunks)
        if (c.byte_offset + c.range.size() * 4 + states_bytes > sizes[c.file])
          return "manifest.json: " + p.name + "'s elements [" + std::to_string(c.range.begin) +
                 ", " + std::to_string(c.range.end) + ") reach past the " +
                 std::to_string(sizes[c.file]) + " bytes of " + index.files[c.file];
  } catch (const std::invalid_argument& e) {
    return std::string("manifest.json: ") + e.what();
  }
  return "";
}

}  // namespace gpurun

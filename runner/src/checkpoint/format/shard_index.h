// The manifest's description of a sharded checkpoint (docs/architecture.md, "Checkpoint
// directory"): which bytes of which shard file hold which elements of which parameter's
// optimizer state. Torch-free, so that manifest.cpp (and the manifest fuzz target) checks it
// whenever a folder is examined.
//
// A sharded save by N ranks writes one file per rank, optim-shard-RRRRR-of-NNNNN.bin: raw
// little-endian fp32, one section per state name in `states` order, each section the rank's
// whole slice of the flat buffer (optim/flat_layout.h), S = shard_numel elements, padding
// included (zeros). The manifest's `sharded_optimizer` member records:
//
//   {"format": "flat-fp32-le", "optimizer": "adamw", "world_size": N, "step_count": 12,
//    "padded_numel": P, "shard_numel": S, "states": ["exp_avg", "exp_avg_sq", "master"],
//    "files": ["optim-shard-00000-of-00002.bin", ...],
//    "parameters": [{"name": "fc.weight", "shape": [4, 3], "offset": 0,
//                    "chunks": [[file, begin, end, byte_offset], ...]}, ...]}
//
// A chunk says that elements [begin, end) of the parameter's flattened elements are, for the
// first state, at byte_offset of files[file], and for state k at byte_offset + k x S x 4. A
// reader goes by the chunks alone (never by the arithmetic of one writer), so resharding is
// intersecting the element ranges a rank now owns with the chunks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optim/flat_layout.h"

namespace gpurun {

/// format_version of a manifest with a sharded_optimizer member (2: without one). A gpurun that
/// reads only version 2 refuses a sharded checkpoint as newer rather than missing its state.
inline constexpr int kShardedFormatVersion = 3;

/// The manifest member describing a sharded checkpoint's optimizer state.
inline constexpr const char* kShardedOptimizerKey = "sharded_optimizer";

/// "optim-shard-00001-of-00004.bin" for rank 1 of 4.
std::string shard_file_name(int64_t rank, int64_t world_size);

/// Elements [range) of one parameter, for the first state at `byte_offset` of files[file].
struct ShardChunk {
  size_t file = 0;
  ElementRange range;
  int64_t byte_offset = 0;
};

struct ShardedParameter {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;  ///< in the saving run's flat buffer (for people; readers use chunks)
  std::vector<ShardChunk> chunks;  ///< sorted by range.begin, tiling [0, numel)
};

struct ShardIndex {
  std::string optimizer;  ///< optim.name: sgd | adam | adamw
  int64_t world_size = 1;
  int64_t step_count = 0;  ///< FlatOptimizer::step_count() at the save
  int64_t padded_numel = 0;
  int64_t shard_numel = 0;  ///< S: elements of one section
  std::vector<std::string> states;
  std::vector<std::string> files;
  std::vector<ShardedParameter> parameters;

  /// Bytes between two states' sections in a file (S x 4).
  int64_t section_bytes() const { return shard_numel * 4; }
  /// The index of state `name` in `states`, or -1.
  int64_t state_index(const std::string& name) const;
  /// The parameter named `name`, or null.
  const ShardedParameter* parameter(const std::string& name) const;

  nlohmann::json to_json() const;
  /// Parses and checks the member (types, chunks that tile each parameter, files named once);
  /// throws std::invalid_argument naming what is wrong.
  static ShardIndex from_json(const nlohmann::json& j);
};

/// The index of a save of `layout` by layout.world_size() ranks, each rank's file holding its
/// whole slice per state (the layout at the top of this file).
ShardIndex make_shard_index(const FlatLayout& layout, const std::string& optimizer,
                            const std::vector<std::string>& states, int64_t step_count);

/// Checks a manifest's sharded_optimizer member against its files table: "" when consistent
/// (or when the manifest has none and format_version < 3), else the problem ("a sharded
/// checkpoint whose manifest disagrees with its shard files is damaged"): no member in a
/// version 3 manifest, a member that does not parse, a shard file missing from the files table,
/// or a chunk reaching past its file's listed size.
std::string check_sharded_manifest(const nlohmann::json& manifest);

}  // namespace gpurun

// manifest.json's text (docs/architecture.md, "Manifest"): written with a checksum of its own,
// read back and checked. Internal to checkpoint/: store.h is the interface.
//
// The seal: the manifest's last member is "manifest_xxh3", the xxh3-64 (16 lowercase hex
// digits) of every byte of the file before the comma that precedes that member:
//
//   {
//     "format_version": 2,
//     ...
//     "files": {...}<-- the bytes up to here are hashed
//     ,"manifest_xxh3": "0123456789abcdef"   (written as ",\n  \"manifest_xxh3\": ...\n}\n")
//   }
//
// It covers the exact bytes, not a re-serialisation, so no JSON library's formatting of numbers
// can change it, and whatever the manifest lists (the files of one rank or the shards of many)
// is covered. Only the whitespace after the seal is outside it. A manifest of format_version 1
// (gpurun before the seal) has none: it is read, with the folder name's check alone.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/format/checkpoint_types.h"

namespace gpurun::checkpoint_folder {

/// The key of the manifest's own checksum, its last member.
inline constexpr const char* kManifestChecksum = "manifest_xxh3";

/// The format_version of manifests without a seal (read, never written).
inline constexpr int kUnsealedFormatVersion = 1;

/// The text of manifest.json for a new checkpoint: format_version first (the first thing a
/// reader checks), every field of `meta`, `files` ({name: {bytes, xxh3}}) and the seal last.
std::string manifest_text(const CheckpointMeta& meta, const nlohmann::json& files);

/// Checks the text of a checkpoint's manifest.json into `info` (manifest, epoch, global step,
/// whether it is sealed). Returns the problem that makes the checkpoint incomplete, "" when the
/// manifest is usable: not a JSON object, a format_version this gpurun does not read, a seal
/// that is missing (format_version 2 and later) or does not match, a missing or mistyped field,
/// no files table, or an epoch and global step other than those of the folder's name
/// (info.name, when it has checkpoint_name()'s form).
std::string check_manifest(const std::string& text, CheckpointInfo& info);

/// Checks the seal of a manifest's text: "" when its last member is a manifest_xxh3 that matches
/// the bytes before it, else the problem ("manifest.json: its own xxh3 ... does not match").
/// `sealed` is set when the text ends with a seal, matching or not.
std::string check_seal(const std::string& text, bool& sealed);

}  // namespace gpurun::checkpoint_folder

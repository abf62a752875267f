// run.yaml's values (config.cpp's part that knows the types): a YAML node, from the file, a
// --set or a manifest's JSON, converted to its key's type and checked against the key's limit,
// and a value written back as `gpurun run --print-config` and config.json show it. Private to
// gpurun_core.
#pragma once

#include <string>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json_fwd.hpp>

#include "config/schema.h"

namespace gpurun::detail {

/// Converts `n` to `key`'s type and checks the key's limit. On success stores the value in `c`
/// and returns ""; otherwise leaves `c` as it was and returns the message, which names the key,
/// what it accepts and what it got (the caller adds where it came from). Integers are plain
/// decimal int64; floats YAML floats in the C locale (nan and inf refused); strings valid UTF-8.
std::string assign(const Key& key, const YAML::Node& n, RunConfig& c);

/// A node as the user wrote it, for messages: numbers bare, text quoted, lists and maps in
/// flow style, "nothing" for a missing or null node.
std::string show(const YAML::Node& n);

/// The value at `f` as run.yaml would hold it ("auto" for the word of a number-or-word key:
/// a float's NaN, or an integer's kAutoCount when `word` is the key's Limit::word).
std::string format_value(const Field& f, const char* word = nullptr);

/// The value at `f` as config.json holds it (the word as format_value()).
nlohmann::json value_json(const Field& f, const char* word = nullptr);

}  // namespace gpurun::detail

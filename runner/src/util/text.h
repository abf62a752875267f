// Text read from disk (LATEST, folder and file names) made safe to print on a terminal, and
// the small string tests C++17 lacks.
#pragma once

#include <string>
#include <string_view>

#include <spdlog/fmt/fmt.h>

namespace gpurun {

/// Whether `text` begins with `prefix` (C++20's std::string::starts_with).
inline bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

/// `text` in double quotes, with quotes, backslashes, control characters and invalid UTF-8
/// escaped the way fmt's "{:?}" writes them ("ckpt\x00\xff\n"): none of its bytes can move the
/// cursor, clear the screen or end a line. Valid UTF-8 letters stay as they are.
inline std::string printable_quoted(const std::string& text) { return fmt::format("{:?}", text); }

/// `text` itself when printable_quoted() would escape nothing in it, else printable_quoted(text):
/// ordinary names print as before, odd ones escaped and quoted.
inline std::string printable(const std::string& text) {
  std::string quoted = printable_quoted(text);
  return quoted.size() == text.size() + 2 ? text : quoted;
}

}  // namespace gpurun

// UTF-8 to code points and back (RFC 3629), strict: the text dataset and the epoch sample
// share it, so that a character is the same unit in both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpurun::utf8 {

/// One code point as UTF-8 (1 to 4 bytes).
std::string encode(char32_t code_point);

/// The code points of `text`. Throws ConfigError "`source`:LINE: invalid UTF-8 ... at byte
/// COLUMN" for an invalid or truncated sequence, an overlong form, a surrogate, or a value
/// above U+10FFFF (RFC 3629, section 3).
std::vector<char32_t> decode(const std::string& text, const std::string& source);

/// "U+00E9" for messages.
std::string describe(char32_t code_point);

}  // namespace gpurun::utf8

#include "util/utf8.h"

#include <cstdio>

#include "gpurun/errors.h"

namespace gpurun::utf8 {

std::string encode(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
  return out;
}

std::string describe(char32_t code_point) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(code_point));
  return buf;
}

std::vector<char32_t> decode(const std::string& text, const std::string& source) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  size_t line = 1, line_start = 0;
  const auto fail = [&](size_t at, const char* what) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[at]));
    throw ConfigError(source + ":" + std::to_string(line) + ": invalid UTF-8 (" + what + ", byte " +
                      byte + " at column " + std::to_string(at - line_start + 1) +
                      "); the text dataset reads UTF-8 files");
  };
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      out.push_back(b);
      if (b == '\n') ++line, line_start = i + 1;
      ++i;
      continue;
    }
    size_t extra = 0;
    char32_t c = 0, min = 0;
    if ((b & 0xE0) == 0xC0)
      extra = 1, c = b & 0x1F, min = 0x80;
    else if ((b & 0xF0) == 0xE0)
      extra = 2, c = b & 0x0F, min = 0x800;
    else if ((b & 0xF8) == 0xF0)
      extra = 3, c = b & 0x07, min = 0x10000;
    else
      fail(i, "not a leading byte");
    if (i + extra >= text.size()) fail(i, "truncated sequence");
    for (size_t k = 1; k <= extra; ++k) {
      const auto cont = static_cast<unsigned char>(text[i + k]);
      if ((cont & 0xC0) != 0x80) fail(i + k, "expected a continuation byte");
      c = (c << 6) | (cont & 0x3F);
    }
    if (c < min) fail(i, "overlong form");
    if (c >= 0xD800 && c <= 0xDFFF) fail(i, "surrogate code point");
    if (c > 0x10FFFF) fail(i, "above U+10FFFF");
    out.push_back(c);
    i += extra + 1;
  }
  return out;
}

}  // namespace gpurun::utf8

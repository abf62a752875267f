// JPEG and PNG files to pixels and back, through Debian's libraries: libjpeg-turbo's TurboJPEG
// API (libturbojpeg0) and libpng's simplified API (libpng16-16). The image_folder data set
// decodes with them; tests and benchmarks encode with them. The choice and its measurement:
// scripts/bench/image_decode.cpp (README, "image_folder").
//
// Every function here is safe to call from several threads at once (each call has its own
// decoder state).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace gpurun {

enum class ImageFormat { kUnknown, kJpeg, kPng };

/// The format of a file from its first bytes (JPEG: FF D8 FF; PNG: its 8-byte signature),
/// never from its name. kUnknown for anything else, a short file included.
ImageFormat sniff_image_format(const uint8_t* bytes, size_t size);

/// "JPEG", "PNG" or "not a JPEG or PNG file".
const char* image_format_name(ImageFormat format);

/// A file's bytes. Throws IoError (with errno and path) when it cannot be opened or read.
std::vector<uint8_t> read_file_bytes(const std::string& path);

/// Width and height in pixels from the header alone. Throws ConfigError naming `path` (used
/// only in messages) when the header does not parse.
struct ImageSize {
  int64_t width = 0, height = 0;
};
ImageSize image_size_of(const std::vector<uint8_t>& bytes, const std::string& path);

/// Decodes a JPEG or PNG file's bytes into uint8 pixels [H, W, channels] (contiguous, HWC),
/// channels 1 (grayscale: libjpeg's and libpng's RGB to Y conversion) or 3 (RGB; a gray image
/// is repeated). PNG transparency is composited onto black and 16-bit samples are reduced to 8.
/// `min_width`/`min_height` > 0 allow a JPEG to be decoded at a reduced scale in the DCT domain
/// (TurboJPEG's M/8 scaling factors), the smallest whose output is still at least that size;
/// the result's size says what was chosen. Throws ConfigError naming `path` for bytes that are
/// not a complete JPEG or PNG (unknown format, truncated or corrupt data).
at::Tensor decode_image(const std::vector<uint8_t>& bytes, int64_t channels,
                        const std::string& path, int64_t min_width = 0, int64_t min_height = 0);

/// uint8 pixels [H, W, C] (C 1 or 3) as a PNG file's bytes (libpng, lossless).
std::vector<uint8_t> encode_png(const at::Tensor& pixels);

/// uint8 pixels [H, W, C] (C 1 or 3) as a baseline JPEG file's bytes (TurboJPEG, 4:2:0
/// subsampling for RGB), quality 1..100.
std::vector<uint8_t> encode_jpeg(const at::Tensor& pixels, int quality = 90);

}  // namespace gpurun

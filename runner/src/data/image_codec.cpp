// JPEG through TurboJPEG, PNG through libpng's simplified API (png_image). The colour
// conversions follow what torchvision's ImageFolder gets from PIL's Image.convert():
//   RGB -> gray: ITU-R 601-2 luma, L = (19595 R + 38470 G + 7471 B + 2^15) >> 16 (PIL's
//   ImagingConvert "rgb2l"); a colour JPEG decoded to gray is its Y plane, the same luma
//   computed before the chroma was subsampled;
//   an alpha channel is dropped, not composited (PIL's RGBA -> RGB);
//   gray -> RGB repeats the value.
#include "data/image_codec.h"

#include <fcntl.h>
#include <png.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <ATen/ops/empty.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "gpurun/errors.h"

namespace gpurun {
namespace {

struct TjCloser {
  void operator()(void* handle) const { tjDestroy(handle); }
};
using TjHandle = std::unique_ptr<void, TjCloser>;

/// This thread's decompressor: TurboJPEG's handles are not to be shared between threads, and
/// creating one per image costs more than a small image's decode.
tjhandle thread_decompressor() {
  thread_local TjHandle handle(tjInitDecompress());
  if (!handle) throw Error(std::string("TurboJPEG: tjInitDecompress failed: ") + tjGetErrorStr());
  return handle.get();
}

std::string tj_error(tjhandle handle) { return tjGetErrorStr2(handle); }

[[noreturn]] void bad_file(const std::string& path, ImageFormat format, const std::string& why) {
  throw ConfigError(path + ": not a readable " + image_format_name(format) + " file (" + why + ")");
}

/// RGB [H, W, 3] -> gray [H, W, 1] by PIL's integer luma.
at::Tensor rgb_to_gray(const at::Tensor& rgb) {
  const int64_t h = rgb.size(0), w = rgb.size(1);
  at::Tensor gray = at::empty({h, w, 1}, rgb.options());
  const uint8_t* in = rgb.data_ptr<uint8_t>();
  uint8_t* out = gray.data_ptr<uint8_t>();
  for (int64_t p = 0; p < h * w; ++p, in += 3)
    out[p] =
        static_cast<uint8_t>((19595u * in[0] + 38470u * in[1] + 7471u * in[2] + 0x8000u) >> 16);
  return gray;
}

at::Tensor decode_jpeg(const std::vector<uint8_t>& bytes, int64_t channels, const std::string& path,
                       int64_t min_width, int64_t min_height) {
  tjhandle tj = thread_decompressor();
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, bytes.data(), bytes.size(), &width, &height, &subsampling,
                          &colorspace) != 0)
    bad_file(path, ImageFormat::kJpeg, tj_error(tj));
  // The smallest of TurboJPEG's factors (M/8 and more) that keeps the asked size: the inverse
  // DCT then computes fewer pixels, which costs less than computing them all and resizing.
  int out_w = width, out_h = height;
  if (min_width > 0 && min_height > 0) {
    int count = 0;
    const tjscalingfactor* factors = tjGetScalingFactors(&count);
    for (int k = 0; k < count; ++k) {
      const tjscalingfactor f = factors[k];
      if (f.num >= f.denom) continue;
      const int w = TJSCALED(width, f), h = TJSCALED(height, f);
      if (w >= min_width && h >= min_height && w < out_w) out_w = w, out_h = h;
    }
  }
  const int pixel_format = channels == 1 ? TJPF_GRAY : TJPF_RGB;
  at::Tensor out = at::empty({out_h, out_w, channels}, at::kByte);
  // Accurate DCT: what libjpeg (and so PIL) uses by default.
  if (tjDecompress2(tj, bytes.data(), bytes.size(), out.data_ptr<uint8_t>(), out_w, 0, out_h,
                    pixel_format, TJFLAG_ACCURATEDCT) != 0) {
    // Warnings such as extraneous bytes before a marker leave a whole image, which PIL
    // accepts too; a premature end leaves part of one (the rest grey), which PIL refuses as
    // truncated, and so does this.
    const std::string message = tj_error(tj);
    if (tjGetErrorCode(tj) != TJERR_WARNING || message.find("Premature end") != std::string::npos)
      bad_file(path, ImageFormat::kJpeg, message);
  }
  return out;
}

at::Tensor decode_png(const std::vector<uint8_t>& bytes, int64_t channels,
                      const std::string& path) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  struct Free {
    png_image* image;
    ~Free() { png_image_free(image); }
  } release{&image};
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
    bad_file(path, ImageFormat::kPng, image.message);
  const bool colour = image.format & PNG_FORMAT_FLAG_COLOR;
  const bool alpha = image.format & PNG_FORMAT_FLAG_ALPHA;
  // Read as the file holds it (gray or RGB, alpha kept so that it is dropped, not composited).
  image.format = (colour ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY) | (alpha ? PNG_FORMAT_FLAG_ALPHA : 0);
  const int64_t stored = (colour ? 3 : 1) + (alpha ? 1 : 0);
  const int64_t h = image.height, w = image.width;
  at::Tensor raw = at::empty({h, w, stored}, at::kByte);
  if (!png_image_finish_read(&image, nullptr, raw.data_ptr<uint8_t>(), 0, nullptr))
    bad_file(path, ImageFormat::kPng, image.message);
  at::Tensor pixels = alpha ? raw.narrow(2, 0, stored - 1).contiguous() : raw;
  if (channels == 1) return colour ? rgb_to_gray(pixels) : pixels;
  return colour ? pixels : pixels.expand({h, w, 3}).contiguous();
}

}  // namespace

ImageFormat sniff_image_format(const uint8_t* bytes, size_t size) {
  static const uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff)
    return ImageFormat::kJpeg;
  if (size >= 8 && std::memcmp(bytes, kPngSignature, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

const char* image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    default:
      return "JPEG or PNG";
  }
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("open", path, errno);
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } closer{fd};
  const off_t end = ::lseek(fd, 0, SEEK_END);
  if (end < 0 || ::lseek(fd, 0, SEEK_SET) < 0) throw IoError("seek", path, errno);
  std::vector<uint8_t> bytes(static_cast<size_t>(end));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError("read", path, errno);
    if (n == 0) break;  // shrunk while read: what is there is decoded, and judged
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

ImageSize image_size_of(const std::vector<uint8_t>& bytes, const std::string& path) {
  const ImageFormat format = sniff_image_format(bytes.data(), bytes.size());
  if (format == ImageFormat::kJpeg) {
    tjhandle tj = thread_decompressor();
    int width = 0, height = 0, subsampling = 0, colorspace = 0;
    if (tjDecompressHeader3(tj, bytes.data(), bytes.size(), &width, &height, &subsampling,
                            &colorspace) != 0)
      bad_file(path, format, tj_error(tj));
    return {width, height};
  }
  if (format == ImageFormat::kPng) {
    png_image image;
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    const bool ok = png_image_begin_read_from_memory(&image, bytes.data(), bytes.size());
    const std::string message = image.message;
    png_image_free(&image);
    if (!ok) bad_file(path, format, message);
    return {image.width, image.height};
  }
  bad_file(path, format, "its first bytes are neither JPEG's nor PNG's signature");
}

at::Tensor decode_image(const std::vector<uint8_t>& bytes, int64_t channels,
                        const std::string& path, int64_t min_width, int64_t min_height) {
  TORCH_CHECK(channels == 1 || channels == 3, "decode_image: channels must be 1 or 3, got ",
              channels);
  switch (sniff_image_format(bytes.data(), bytes.size())) {
    case ImageFormat::kJpeg:
      return decode_jpeg(bytes, channels, path, min_width, min_height);
    case ImageFormat::kPng:
      return decode_png(bytes, channels, path);
    default:
      bad_file(
          path, ImageFormat::kUnknown,
          bytes.empty() ? "it is empty" : "its first bytes are neither JPEG's nor PNG's signature");
  }
}

std::vector<uint8_t> encode_png(const at::Tensor& pixels) {
  TORCH_CHECK(pixels.dim() == 3 && pixels.scalar_type() == at::kByte &&
                  (pixels.size(2) == 1 || pixels.size(2) == 3),
              "encode_png: uint8 [H, W, 1 or 3] expected, got ", pixels.sizes());
  const at::Tensor p = pixels.contiguous();
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(p.size(1));
  image.height = static_cast<png_uint_32>(p.size(0));
  image.format = p.size(2) == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, p.data_ptr<uint8_t>(), 0, nullptr))
    throw Error(std::string("libpng: ") + image.message);
  std::vector<uint8_t> out(size);
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, p.data_ptr<uint8_t>(), 0, nullptr))
    throw Error(std::string("libpng: ") + image.message);
  out.resize(size);
  return out;
}

std::vector<uint8_t> encode_jpeg(const at::Tensor& pixels, int quality) {
  TORCH_CHECK(pixels.dim() == 3 && pixels.scalar_type() == at::kByte &&
                  (pixels.size(2) == 1 || pixels.size(2) == 3),
              "encode_jpeg: uint8 [H, W, 1 or 3] expected, got ", pixels.sizes());
  const at::Tensor p = pixels.contiguous();
  TjHandle tj(tjInitCompress());
  if (!tj) throw Error(std::string("TurboJPEG: tjInitCompress failed: ") + tjGetErrorStr());
  const bool gray = p.size(2) == 1;
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  if (tjCompress2(tj.get(), p.data_ptr<uint8_t>(), static_cast<int>(p.size(1)), 0,
                  static_cast<int>(p.size(0)), gray ? TJPF_GRAY : TJPF_RGB, &jpeg, &size,
                  gray ? TJSAMP_GRAY : TJSAMP_420, quality, 0) != 0)
    throw Error("TurboJPEG: " + tj_error(tj.get()));
  std::vector<uint8_t> out(jpeg, jpeg + size);
  tjFree(jpeg);
  return out;
}

}  // namespace gpurun

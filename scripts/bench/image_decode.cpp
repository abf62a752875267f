// Decoder choice for data.name image_folder: decodes one 400x300 RGB image, as JPEG and as PNG,
// many times with each candidate library and prints microseconds per image. No Torch: only
// the libraries (scripts/bench/image_folder.sh builds and runs it).
//   TurboJPEG (libjpeg-turbo), full size and DCT-domain 1/2 scaling (tjDecompress2's factor)
//   libjpeg (the same libjpeg-turbo through its libjpeg API)
//   libpng (png_image simplified API) and libspng
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>
#include <png.h>
#include <spng.h>
#include <turbojpeg.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

namespace {

constexpr int kW = 400, kH = 300;

double time_us(int reps, const std::function<void()>& f) {
  f();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
         reps;
}

}  // namespace

int main() {
  // A smooth picture with some noise, as a photograph's JPEG would carry.
  std::vector<unsigned char> rgb(kW * kH * 3);
  std::mt19937 gen(1);
  std::normal_distribution<float> noise(0, 6);
  for (int y = 0; y < kH; ++y)
    for (int x = 0; x < kW; ++x)
      for (int c = 0; c < 3; ++c) {
        float v = 128 + 90 * std::sin(x * 0.03f + c) * std::cos(y * 0.02f - c) + noise(gen);
        rgb[(y * kW + x) * 3 + c] = static_cast<unsigned char>(std::fmin(255, std::fmax(0, v)));
      }
  tjhandle enc = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long jpeg_size = 0;
  if (tjCompress2(enc, rgb.data(), kW, 0, kH, TJPF_RGB, &jpeg, &jpeg_size, TJSAMP_420, 90, 0))
    return 1;
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = kW, img.height = kH, img.format = PNG_FORMAT_RGB;
  png_alloc_size_t png_size = 0;
  png_image_write_to_memory(&img, nullptr, &png_size, 0, rgb.data(), 0, nullptr);
  std::vector<unsigned char> png(png_size);
  if (!png_image_write_to_memory(&img, png.data(), &png_size, 0, rgb.data(), 0, nullptr)) return 1;
  png.resize(png_size);
  std::printf("one %dx%d RGB image: JPEG %lu bytes (quality 90, 4:2:0), PNG %zu bytes\n", kW, kH,
              jpeg_size, png.size());

  std::vector<unsigned char> out(kW * kH * 3);
  tjhandle dec = tjInitDecompress();
  const int reps = 400;
  const double tj_full = time_us(reps, [&] {
    tjDecompress2(dec, jpeg, jpeg_size, out.data(), kW, 0, kH, TJPF_RGB, TJFLAG_FASTDCT);
  });
  const double tj_accurate = time_us(reps, [&] {
    tjDecompress2(dec, jpeg, jpeg_size, out.data(), kW, 0, kH, TJPF_RGB, TJFLAG_ACCURATEDCT);
  });
  const double tj_half = time_us(reps, [&] {
    tjDecompress2(dec, jpeg, jpeg_size, out.data(), kW / 2, 0, kH / 2, TJPF_RGB, TJFLAG_FASTDCT);
  });
  const double tj_gray = time_us(reps, [&] {
    tjDecompress2(dec, jpeg, jpeg_size, out.data(), kW, 0, kH, TJPF_GRAY, TJFLAG_FASTDCT);
  });
  const double libjpeg = time_us(reps, [&] {
    jpeg_decompress_struct cinfo;
    jpeg_error_mgr jerr;
    cinfo.err = jpeg_std_error(&jerr);
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, jpeg, jpeg_size);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    while (cinfo.output_scanline < cinfo.output_height) {
      unsigned char* row = out.data() + cinfo.output_scanline * kW * 3;
      jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
  });
  const double libpng = time_us(reps, [&] {
    png_image r{};
    r.version = PNG_IMAGE_VERSION;
    png_image_begin_read_from_memory(&r, png.data(), png.size());
    r.format = PNG_FORMAT_RGB;
    png_image_finish_read(&r, nullptr, out.data(), 0, nullptr);
  });
  const double spng = time_us(reps, [&] {
    spng_ctx* ctx = spng_ctx_new(0);
    spng_set_png_buffer(ctx, png.data(), png.size());
    size_t n = 0;
    spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &n);
    spng_decode_image(ctx, out.data(), n, SPNG_FMT_RGB8, 0);
    spng_ctx_free(ctx);
  });
  std::printf("TurboJPEG, full size (fast DCT)      : %7.1f us\n", tj_full);
  std::printf("TurboJPEG, full size (accurate DCT)  : %7.1f us\n", tj_accurate);
  std::printf("TurboJPEG, 1/2 scale in the DCT      : %7.1f us\n", tj_half);
  std::printf("TurboJPEG, full size to grayscale    : %7.1f us\n", tj_gray);
  std::printf("libjpeg API (libjpeg-turbo), full    : %7.1f us\n", libjpeg);
  std::printf("libpng (png_image), RGB              : %7.1f us\n", libpng);
  std::printf("libspng, RGB                         : %7.1f us\n", spng);
  tjFree(jpeg);
  tjDestroy(enc);
  tjDestroy(dec);
  return 0;
}

#include "data/image_transforms.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/_upsample_bilinear2d_aa.h>

#include <algorithm>
#include <cmath>
#include <mutex>

namespace gpurun {

double uniform01(at::Generator& gen) {
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return static_cast<double>(impl->random64() >> 11) * 0x1.0p-53;
}

namespace {

/// An integer uniform in [lo, hi] (torch.randint(lo, hi + 1)).
int64_t uniform_int(at::Generator& gen, int64_t lo, int64_t hi) {
  const auto span = static_cast<double>(hi - lo + 1);
  return std::min(hi, lo + static_cast<int64_t>(std::floor(uniform01(gen) * span)));
}

/// Python's round(): halves to even, as int(round(x)) in torchvision.
int64_t py_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

}  // namespace

CropBox random_resized_crop_box(int64_t width, int64_t height, at::Generator& gen) {
  constexpr double kScaleLo = 0.08, kScaleHi = 1.0;
  constexpr double kRatioLo = 3.0 / 4.0, kRatioHi = 4.0 / 3.0;
  const double area = static_cast<double>(width * height);
  const double log_lo = std::log(kRatioLo), log_hi = std::log(kRatioHi);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * (kScaleLo + (kScaleHi - kScaleLo) * uniform01(gen));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * uniform01(gen));
    const int64_t w = py_round(std::sqrt(target_area * aspect));
    const int64_t h = py_round(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int64_t top = uniform_int(gen, 0, height - h);
      const int64_t left = uniform_int(gen, 0, width - w);
      return {top, left, h, w};
    }
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < kRatioLo) {
    h = py_round(static_cast<double>(w) / kRatioLo);
  } else if (in_ratio > kRatioHi) {
    w = py_round(static_cast<double>(h) * kRatioHi);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

std::pair<int64_t, int64_t> resized_size(int64_t width, int64_t height, int64_t size) {
  const bool portrait = width <= height;
  const int64_t shorter = portrait ? width : height, longer = portrait ? height : width;
  const auto new_long = static_cast<int64_t>(
      static_cast<double>(size) * static_cast<double>(longer) / static_cast<double>(shorter));
  return portrait ? std::make_pair(new_long, size) : std::make_pair(size, new_long);
}

CropBox centre_crop_box(int64_t width, int64_t height, int64_t size) {
  return {py_round(static_cast<double>(height - size) / 2.0),
          py_round(static_cast<double>(width - size) / 2.0), size, size};
}

at::Tensor resize_bilinear(const at::Tensor& hwc, int64_t out_h, int64_t out_w) {
  // [H, W, C] viewed as [1, C, H, W] in channels-last layout, no copy: ATen's uint8 kernel
  // works in that layout (its vectorised path), so the pixels go in as decoded.
  const at::Tensor nchw = hwc.permute({2, 0, 1}).unsqueeze(0);
  if (nchw.size(2) == out_h && nchw.size(3) == out_w) return nchw.squeeze(0);
  return at::_upsample_bilinear2d_aa(nchw, {out_h, out_w}, /*align_corners=*/false).squeeze(0);
}

void normalize_into(const at::Tensor& chw, const std::vector<double>& mean,
                    const std::vector<double>& std, at::Tensor& out) {
  const int64_t c = chw.size(0);
  for (int64_t k = 0; k < c; ++k) {
    // (x / 255 - m) / s = x * (1 / (255 s)) - m / s: one multiply-add per pixel.
    const double scale = 1.0 / (255.0 * std[k]), shift = -mean[k] / std[k];
    at::Tensor o = out.select(0, k);
    o.copy_(chw.select(0, k));
    o.mul_(scale).add_(shift);
  }
}

}  // namespace gpurun

// The image_folder data set's transforms, after torchvision's definitions
// (torchvision/transforms/transforms.py and functional.py, v0.26):
//   training, data.augment standard: RandomResizedCrop(S, scale=(0.08, 1), ratio=(3/4, 4/3),
//     bilinear, antialias) then RandomHorizontalFlip(0.5);
//   evaluation, and training under data.augment none: Resize(S) (the shorter side to S,
//     bilinear, antialias) then CenterCrop(S);
//   then ToTensor (x / 255) and Normalize(mean, std).
// Every random draw comes from the generator passed in: the data set seeds one per sample with
// sample_seed(seed, epoch, position), never the global generator.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace gpurun {

/// A rectangle of an image in pixels: top row, left column, height, width.
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
  bool operator==(const CropBox& o) const {
    return top == o.top && left == o.left && height == o.height && width == o.width;
  }
};

/// A uniform draw in [0, 1) from `gen` (a CPU generator): 53 random bits.
double uniform01(at::Generator& gen);

/// RandomResizedCrop.get_params for an image of `width` x `height`: up to 10 draws of an area
/// (a fraction in [0.08, 1) of the image's) and an aspect ratio (log-uniform in [3/4, 4/3));
/// the first whose rounded width and height fit is placed uniformly; after 10 misses, the
/// centre crop of the whole image clamped to the ratio range. Four or more draws from `gen`.
CropBox random_resized_crop_box(int64_t width, int64_t height, at::Generator& gen);

/// Resize(size)'s output size for an image of `width` x `height`: the shorter side becomes
/// `size`, the longer int(size * long / short) (torchvision's _compute_resized_output_size).
/// Returned as {height, width}.
std::pair<int64_t, int64_t> resized_size(int64_t width, int64_t height, int64_t size);

/// CenterCrop(size) of an image of `width` x `height` no smaller than size x size:
/// top = round((height - size) / 2), left likewise.
CropBox centre_crop_box(int64_t width, int64_t height, int64_t size);

/// Resamples uint8 pixels [H, W, C] to uint8 [C, out_h, out_w]: bilinear, antialiased when
/// shrinking, half-pixel centres (ATen's _upsample_bilinear2d_aa, the kernel torchvision's
/// resize runs on tensors; its uint8 path rounds as PIL does).
at::Tensor resize_bilinear(const at::Tensor& hwc, int64_t out_h, int64_t out_w);

/// The normalisation: uint8 [C, S, S] -> float32 (x / 255 - mean[c]) / std[c], written into
/// `out` (float32 [C, S, S]). `mean` and `std` hold one value per channel.
void normalize_into(const at::Tensor& chw, const std::vector<double>& mean,
                    const std::vector<double>& std, at::Tensor& out);

}  // namespace gpurun

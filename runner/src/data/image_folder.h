// The `image_folder` data set: one subfolder per class, as torchvision's ImageFolder reads it.
//
//   data.path/           class index = rank of the folder's name in sorted (byte) order
//     cat/ 001.jpg ...   JPEG and PNG files, known by their first bytes, not their names;
//     dog/ a/b.png ...   subfolders are walked; names starting with '.' are ignored
//
// data.eval_path is a folder of the same classes. Without it, data.eval_fraction of the files
// is held out by a shuffle seeded with data.seed alone. data.train_samples / eval_samples > 0
// take a seeded random subset of that many files of each split.
//
// What is checked when the run sets up, each a ConfigError (exit 2) before anything is written
// under --ckpt: a missing or unlistable folder, no class folders, a class folder without image
// files, eval classes that differ from training's, and a file whose first bytes are neither
// JPEG's nor PNG's (data.skip_bad: dropped from the list, logged). What can only be found by
// decoding is found when the sample is read: a truncated or corrupt file is a ConfigError
// naming the file and the sample (the data, not the machine, is wrong: retrying cannot help),
// or, under data.skip_bad, is replaced by the next readable sample of the split (index + 1,
// ..., wrapping), logged once per file and counted. An I/O error reading a file is an IoError
// (exit 1, retried).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gpurun/config.h"
#include "gpurun/dataset.h"

namespace gpurun {

struct ImageFile {
  std::string path;
  int64_t label = 0;
};

/// A folder of class folders, listed.
struct ImageFolderScan {
  std::vector<std::string> classes;  ///< sorted; class index = position
  std::vector<ImageFile> files;      ///< sorted by class, then path
  std::vector<std::string> skipped;  ///< under skip_bad: files whose first bytes are no image's
};

/// Lists `root` as described above; `key` (data.path, data.eval_path) names it in messages.
/// Throws ConfigError for each startup case above.
ImageFolderScan scan_image_folder(const std::string& root, const std::string& key, bool skip_bad);

/// How samples become tensors (image_transforms.h).
struct ImageTransformOptions {
  int64_t image_size = 224;       ///< S: samples are [channels, S, S]
  int64_t channels = 3;           ///< 1 or 3
  bool augment = true;            ///< training draws RandomResizedCrop + flip; false: eval's
  std::vector<double> mean, std;  ///< one per channel
  bool skip_bad = false;
  std::string key = "data.path";  ///< the split's config key, for messages
};

/// The files of one split as samples: inputs float32 [B, C, S, S], targets int64 [B].
/// get() and evaluation (context.epoch == -1) give Resize + CenterCrop; training batches under
/// augment draw each sample's crop and flip from sample_seed(seed, epoch, position) alone, so a
/// sample's pixels depend on neither the batch it is fetched in nor the thread. Safe for
/// concurrent get_batch calls.
class ImageFolderDataset : public Dataset {
 public:
  ImageFolderDataset(std::vector<ImageFile> files, ImageTransformOptions options);
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  Batch get(const at::Tensor& indices) const override;
  Batch get_batch(const at::Tensor& indices, const BatchContext& context) const override;
  const std::vector<ImageFile>& files() const { return files_; }
  /// Distinct files found unreadable when decoded and skipped (skip_bad) so far.
  int64_t bad_files() const;

 private:
  /// Writes sample `index` into `out` (float32 [C, S, S]); returns its label. `seed` is the
  /// sample's seed when it is drawn at random (training under augment), else nullptr.
  int64_t fill(int64_t index, const uint64_t* seed, at::Tensor out) const;
  void transform_into(const ImageFile& file, const uint64_t* seed, at::Tensor& out) const;

  std::vector<ImageFile> files_;
  ImageTransformOptions options_;
  mutable std::mutex bad_mutex_;
  mutable std::set<int64_t> bad_;
};

/// The factory registered as `image_folder`: both splits, class names, input shape
/// {channels, image_size, image_size}. Throws ConfigError as described above.
DatasetSplits load_image_folder(const DataConfig& config);

}  // namespace gpurun

// The `text` dataset: character-level language modelling on any UTF-8 file (Karpathy's
// char-rnn; Radford et al. 2019 model bytes, we model code points, see below).
//
// A character is one Unicode code point, not a byte: a sample of data.context characters is
// that many readable characters whatever the script, generated text is always valid UTF-8,
// and the vocabulary stays the file's distinct characters (ASCII text: under 100). The
// vocabulary is sorted by code point, so token ids are a pure function of the text.
#include <zlib.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "data/builtin_datasets.h"
#include "gpurun/errors.h"
#include "gpurun/registry.h"
#include "util/utf8.h"

namespace gpurun {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

/// The bytes of `path`; gzip-compressed files are inflated (zlib reads plain files as is).
std::string read_file(const std::string& path, const char* key) {
  if (std::filesystem::is_directory(path))
    throw ConfigError(std::string(key) + ": " + path +
                      " is a directory; the text dataset reads one file");
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f)
    throw ConfigError(std::string(key) + ": cannot open " + path + ": " + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f.get(), buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  if (n < 0) throw ConfigError(std::string(key) + ": cannot read " + path + " (corrupt gzip?)");
  return text;
}

/// Samples i = 0.. of a token sequence: inputs tokens[i*stride .. i*stride+context),
/// targets the same window shifted by one (the next character at every position).
class TextDataset : public Dataset {
 public:
  TextDataset(at::Tensor tokens, int64_t context, int64_t stride, int64_t limit)
      : tokens_(std::move(tokens)), context_(context), stride_(stride) {
    size_ = (tokens_.numel() - context_ - 1) / stride_ + 1;
    if (limit > 0) size_ = std::min(size_, limit);
  }
  int64_t size() const override { return size_; }
  /// inputs and targets int64 [B, context].
  Batch get(const at::Tensor& indices) const override {
    const int64_t batch = indices.numel();
    at::Tensor offsets = indices.mul(stride_).unsqueeze(1).add(at::arange(context_ + 1, at::kLong));
    at::Tensor windows = at::index_select(tokens_, 0, offsets.reshape({-1}))
                             .to(at::kLong)
                             .view({batch, context_ + 1});
    return {windows.narrow(1, 0, context_).contiguous(),
            windows.narrow(1, 1, context_).contiguous()};
  }

 private:
  at::Tensor tokens_;  ///< int32 [L]
  int64_t context_, stride_, size_ = 0;
};

int64_t windows_in(size_t characters, int64_t context, int64_t stride) {
  if (static_cast<int64_t>(characters) < context + 1) return 0;
  return (static_cast<int64_t>(characters) - context - 1) / stride + 1;
}

DatasetSplits load_text(const DataConfig& c) {
  const int64_t stride = c.stride > 0 ? c.stride : c.context;
  std::vector<char32_t> train = utf8::decode(read_file(c.path, "data.path"), c.path);
  std::vector<char32_t> eval;
  std::string eval_source = c.eval_path;
  if (!c.eval_path.empty()) {
    eval = utf8::decode(read_file(c.eval_path, "data.eval_path"), c.eval_path);
  } else {
    // The last eval_fraction of the text, so that evaluation is on text never trained on.
    const auto held = static_cast<size_t>(std::llround(c.eval_fraction * train.size()));
    eval.assign(train.end() - static_cast<std::ptrdiff_t>(held), train.end());
    train.resize(train.size() - held);
    eval_source = "the last " + std::to_string(held) + " characters of " + c.path;
  }
  const auto too_short = [&](const std::string& what, size_t n) {
    return ConfigError("data.context: " + what + " has " + std::to_string(n) +
                       " characters, fewer than data.context + 1 = " +
                       std::to_string(c.context + 1) + " (one sample and its next character)");
  };
  if (windows_in(train.size(), c.context, stride) == 0) throw too_short(c.path, train.size());
  if (windows_in(eval.size(), c.context, c.context) == 0) throw too_short(eval_source, eval.size());

  std::vector<char32_t> vocabulary(train);
  vocabulary.insert(vocabulary.end(), eval.begin(), eval.end());
  std::sort(vocabulary.begin(), vocabulary.end());
  vocabulary.erase(std::unique(vocabulary.begin(), vocabulary.end()), vocabulary.end());
  const auto tokens_of = [&](const std::vector<char32_t>& text) {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i)
      ids[i] = static_cast<int32_t>(
          std::lower_bound(vocabulary.begin(), vocabulary.end(), text[i]) - vocabulary.begin());
    return at::from_blob(ids.data(), {static_cast<int64_t>(ids.size())}, at::kInt).clone();
  };

  DatasetSplits splits;
  splits.train =
      std::make_shared<TextDataset>(tokens_of(train), c.context, stride, c.train_samples);
  // Evaluation windows never overlap, whatever the training stride.
  splits.eval =
      std::make_shared<TextDataset>(tokens_of(eval), c.context, c.context, c.eval_samples);
  const int64_t train_windows = windows_in(train.size(), c.context, stride);
  const int64_t eval_windows = windows_in(eval.size(), c.context, c.context);
  if (c.train_samples > train_windows || c.eval_samples > eval_windows)
    throw ConfigError("data.train_samples/eval_samples: asked for " +
                      std::to_string(c.train_samples) + "/" + std::to_string(c.eval_samples) +
                      " samples; " + c.path + " has " + std::to_string(train_windows) + "/" +
                      std::to_string(eval_windows) + " of " + std::to_string(c.context) +
                      " characters (stride " + std::to_string(stride) + ")");
  splits.input_shape = {c.context};
  splits.num_classes = static_cast<int64_t>(vocabulary.size());
  for (char32_t ch : vocabulary) splits.class_names.push_back(utf8::encode(ch));
  return splits;
}

}  // namespace

void register_text_dataset(Registry& registry) { registry.add_dataset("text", load_text); }

}  // namespace gpurun

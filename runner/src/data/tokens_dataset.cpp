// The `tokens` data set: language modelling on pre-tokenized binary files (nanoGPT's
// train.bin/val.bin, llm.c's .bin shards; data/token_file.h), memory-mapped, never read whole.
//
// A sample is a window of data.context + 1 consecutive tokens: inputs its first context, targets
// its last context (the next token at every position), as the text data set gives. An epoch has
// (T - 1) / context samples for T tokens, whatever data.windows says, so that an epoch reads
// about T tokens in either mode:
//   sequential: sample i is the window at token offset i x context. The windows do not overlap
//     and, visited in the epoch's permutation, each token is an input once per epoch; the last
//     (T - 1) mod context tokens are in no window.
//   random: a training sample's offset is drawn uniformly from [0, T - context - 1] by a
//     generator seeded with sample_seed(seed, epoch, position) (gpurun/dataset.h), as nanoGPT's
//     get_batch draws them, but from the sample's place in the epoch, not from a global stream:
//     a resume, any worker count and any grouping of samples into calls see the same windows.
//     Without a training context (get(), evaluation) a sample is the sequential window.
// Evaluation always reads the eval file's sequential windows: data.eval_path, else val.bin
// beside data.path, else the last data.eval_fraction of data.path's tokens.
// A loss mask (data.mask_path, data.eval_mask_path: one uint8 per token, 1 where the token counts
// as a target) turns the targets it zeroes into kIgnoredTarget (gpurun/loss.h), which the loss
// and the accuracy leave out: supervised fine-tuning's prompt tokens, transformers' labels of
// -100.
#include <sys/mman.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "data/builtin_datasets.h"
#include "data/token_file.h"
#include "gpurun/errors.h"
#include "gpurun/registry.h"

namespace gpurun {
namespace {

/// Samples of the ids [begin, end) of one token file, as the top of this file describes.
class TokensDataset : public Dataset {
 public:
  TokensDataset(std::shared_ptr<const TokenFile> file, std::shared_ptr<const TokenFile> mask,
                int64_t begin, int64_t end, int64_t context, bool random, int64_t vocabulary,
                int64_t limit)
      : file_(std::move(file)),
        mask_(std::move(mask)),
        begin_(begin),
        end_(end),
        context_(context),
        random_(random),
        vocabulary_(vocabulary) {
    size_ = windows(end_ - begin_, context_);
    if (limit > 0) size_ = std::min(size_, limit);
  }

  static int64_t windows(int64_t tokens, int64_t context) {
    return tokens > context ? (tokens - 1) / context : 0;
  }

  int64_t size() const override { return size_; }

  /// inputs and targets int64 [B, context]: the sequential windows `indices`.
  Batch get(const at::Tensor& indices) const override {
    const at::Tensor idx = indices.to(at::kLong).contiguous();
    const int64_t* p = idx.data_ptr<int64_t>();
    return read_windows(idx.numel(), [&](int64_t i) { return begin_ + p[i] * context_; });
  }

  Batch get_batch(const at::Tensor& indices, const BatchContext& context) const override {
    if (!random_ || !context.training()) return get(indices);
    TORCH_CHECK(context.positions.numel() == indices.numel(), "tokens: ", indices.numel(),
                " indices but ", context.positions.numel(), " positions");
    const at::Tensor positions = context.positions.to(at::kLong).contiguous();
    const int64_t* pos = positions.data_ptr<int64_t>();
    const auto starts = static_cast<uint64_t>(end_ - begin_ - context_);  // offsets to draw from
    return read_windows(indices.numel(), [&](int64_t i) {
      // A private generator per sample: its windows depend on its place in the epoch alone.
      at::CPUGeneratorImpl gen(sample_seed(context.seed, context.epoch, pos[i]));
      return begin_ + static_cast<int64_t>(gen.random64() % starts);
    });
  }

 private:
  template <typename Start>
  Batch read_windows(int64_t batch, Start&& start_of) const {
    at::Tensor inputs = at::empty({batch, context_}, at::kLong);
    at::Tensor targets = at::empty({batch, context_}, at::kLong);
    int64_t* in = inputs.data_ptr<int64_t>();
    int64_t* out = targets.data_ptr<int64_t>();
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t start = start_of(b);
      TORCH_CHECK(start >= begin_ && start + context_ + 1 <= end_, "tokens: window at ", start,
                  " outside [", begin_, ", ", end_, ")");
      int64_t* row = in + b * context_;
      const int64_t last = file_->id(start + context_);
      const int64_t largest = std::max(file_->read(start, context_, row), last);
      out[b * context_ + context_ - 1] = last;
      if (largest >= vocabulary_) file_->throw_first_out_of_range(start, context_ + 1, vocabulary_);
      std::memcpy(out + b * context_, row + 1, static_cast<size_t>(context_ - 1) * sizeof(int64_t));
      if (mask_) {
        // The mask of the targets: tokens start + 1 .. start + context.
        std::vector<int64_t> counts(static_cast<size_t>(context_));
        if (mask_->read(start + 1, context_, counts.data()) > 1) throw_not_a_mask(start + 1);
        for (int64_t j = 0; j < context_; ++j)
          if (counts[static_cast<size_t>(j)] == 0) out[b * context_ + j] = kIgnoredTarget;
      }
    }
    return {inputs, targets};
  }

  [[noreturn]] void throw_not_a_mask(int64_t start) const {
    for (int64_t i = start;; ++i)
      if (mask_->id(i) > 1)
        throw ConfigError(mask_->key() + ": " + mask_->path() + " holds " +
                          std::to_string(mask_->id(i)) + " at byte " + std::to_string(i) +
                          "; a loss mask holds 0 (the target does not count) or 1 (it counts)");
  }

  std::shared_ptr<const TokenFile> file_;
  std::shared_ptr<const TokenFile> mask_;  ///< uint8 per token, or null: every target counts
  int64_t begin_, end_, context_;
  bool random_;
  int64_t vocabulary_, size_ = 0;
};

/// The eval file when data.eval_path is empty: val.bin beside data.path, when it is another file.
std::string val_bin_beside(const std::string& path) {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  const stdfs::path val = stdfs::path(path).parent_path() / "val.bin";
  if (!stdfs::is_regular_file(val, ec) || stdfs::equivalent(val, path, ec)) return "";
  return val.string();
}

/// The first window of `file`'s range, checked at set-up: a data.vocab_size far too small (the
/// usual mistake) is found before anything is written to --ckpt; later ids are checked as read.
void check_first_window(const TokenFile& file, int64_t begin, int64_t end, int64_t context,
                        int64_t vocabulary) {
  const int64_t count = std::min(end - begin, context + 1);
  std::vector<int64_t> ids(static_cast<size_t>(count));
  if (file.read(begin, count, ids.data()) >= vocabulary)
    file.throw_first_out_of_range(begin, count, vocabulary);
}

/// Reads the loss mask `mask` once, whole, in 1 MiB pieces: a byte other than 0 or 1 is refused
/// here, before anything is written, naming its offset (a window would find it only when it
/// reads it, or never). Returns how many of the bytes [begin, end) are 1.
int64_t scan_mask(const TokenFile& mask, int64_t begin, int64_t end) {
  constexpr int64_t kPiece = int64_t{1} << 20;
  std::vector<int64_t> bytes(static_cast<size_t>(kPiece));
  int64_t ones = 0;
  for (int64_t at = 0; at < mask.tokens(); at += kPiece) {
    const int64_t n = std::min(kPiece, mask.tokens() - at);
    if (mask.read(at, n, bytes.data()) > 1)
      for (int64_t i = 0; i < n; ++i)
        if (bytes[static_cast<size_t>(i)] > 1)
          throw ConfigError(mask.key() + ": " + mask.path() + " holds " +
                            std::to_string(bytes[static_cast<size_t>(i)]) + " at byte " +
                            std::to_string(at + i) +
                            "; a loss mask holds 0 (the target does not count) or 1 (it counts)");
    for (int64_t i = std::max(begin - at, int64_t{0}); i < std::min(n, end - at); ++i)
      ones += bytes[static_cast<size_t>(i)];
  }
  return ones;
}

DatasetSplits load_tokens(const DataConfig& c) {
  const int raw_width = c.dtype == "uint32" ? 4 : 2;
  auto train = std::make_shared<const TokenFile>(c.path, "data.path", raw_width);
  std::string eval_path = c.eval_path;
  std::string eval_key = "data.eval_path";
  if (eval_path.empty()) {
    eval_path = val_bin_beside(c.path);
    eval_key = "data.eval_path (val.bin beside data.path)";
  }
  std::shared_ptr<const TokenFile> eval =
      eval_path.empty() ? train : std::make_shared<const TokenFile>(eval_path, eval_key, raw_width);

  int64_t vocabulary = c.vocab_size;
  if (vocabulary == 0) {
    vocabulary = train->header_vocabulary();
    if (vocabulary == 0)
      throw ConfigError("data.vocab_size: " + c.path + " is a " + train->describe() +
                        " token file, without llm.c's header: set data.vocab_size to its "
                        "tokenizer's vocabulary (GPT-2: 50257)");
    if (eval->header_vocabulary() != vocabulary)
      throw ConfigError("data.eval_path: " + eval->path() + " is a " + eval->describe() +
                        " token file, but " + c.path + " is a " + train->describe() +
                        " one; set data.vocab_size if they share a vocabulary");
  }

  // Train and eval ranges: whole files, or data.path's tokens split at its last eval_fraction.
  int64_t train_end = train->tokens(), eval_begin = 0;
  std::string eval_source = eval->path();
  if (eval == train) {
    const auto held = static_cast<int64_t>(std::llround(c.eval_fraction * train->tokens()));
    train_end -= held;
    eval_begin = train_end;
    eval_source = "the last " + std::to_string(held) + " tokens of " + c.path +
                  " (data.eval_fraction; no data.eval_path and no val.bin beside it)";
  }
  const auto too_short = [&](const std::string& what, int64_t n) {
    return ConfigError("data.context: " + what + " has " + std::to_string(n) +
                       " tokens, fewer than data.context + 1 = " + std::to_string(c.context + 1) +
                       " (one sample and its next token)");
  };
  const int64_t train_windows = TokensDataset::windows(train_end, c.context);
  const int64_t eval_windows = TokensDataset::windows(eval->tokens() - eval_begin, c.context);
  if (train_windows == 0) throw too_short(c.path, train_end);
  if (eval_windows == 0) throw too_short(eval_source, eval->tokens() - eval_begin);
  if (c.train_samples > train_windows || c.eval_samples > eval_windows)
    throw ConfigError("data.train_samples/eval_samples: asked for " +
                      std::to_string(c.train_samples) + "/" + std::to_string(c.eval_samples) +
                      " samples; " + c.path + " has " + std::to_string(train_windows) +
                      " windows of " + std::to_string(c.context) + " tokens and " + eval_source +
                      " " + std::to_string(eval_windows));
  // Loss masks: one byte per token of their token file, read with the windows.
  const auto open_mask = [](const std::string& path, const char* key, const TokenFile& tokens) {
    auto mask = std::make_shared<const TokenFile>(path, key, 1);
    if (mask->tokens() != tokens.tokens())
      throw ConfigError(std::string(key) + ": " + path + " has " + std::to_string(mask->tokens()) +
                        " bytes; a loss mask has one per token of " + tokens.path() +
                        ", which has " + std::to_string(tokens.tokens()) + " tokens");
    return mask;
  };
  std::shared_ptr<const TokenFile> train_mask, eval_mask;
  if (!c.mask_path.empty()) train_mask = open_mask(c.mask_path, "data.mask_path", *train);
  if (!c.eval_mask_path.empty())
    eval_mask = open_mask(c.eval_mask_path, "data.eval_mask_path", *eval);
  else if (eval == train)
    eval_mask = train_mask;
  else if (train_mask)
    spdlog::warn(
        "data.mask_path is set and data.eval_mask_path is not: evaluation on {} counts "
        "every target",
        eval->path());
  // Each mask is read whole once: a bad byte, or a split whose targets all are left out (its
  // loss would be 0/0), is refused now. Targets are tokens 1.. of a range.
  const auto check_mask = [](const TokenFile& mask, int64_t begin, int64_t end,
                             const std::string& split) {
    const int64_t ones = scan_mask(mask, begin, end);
    if (ones == 0)
      throw ConfigError(mask.key() + ": " + mask.path() + " counts no target of the " + split +
                        " tokens (every byte of [" + std::to_string(begin) + ", " +
                        std::to_string(end) + ") is 0): its loss would have nothing to average");
    spdlog::info("{} {}: {} of the {} {} tokens count as targets", mask.key(), mask.path(), ones,
                 end - begin, split);
  };
  if (train_mask) check_mask(*train_mask, 1, train_end, "training");
  if (eval_mask) check_mask(*eval_mask, eval_begin + 1, eval->tokens(), "evaluation");
  check_first_window(*train, 0, train_end, c.context, vocabulary);
  check_first_window(*eval, eval_begin, eval->tokens(), c.context, vocabulary);

  // Windows land anywhere: read-ahead around a fault would page in tokens no sample reads.
  const bool random = c.windows == "random";
  train->advise(MADV_RANDOM, 0, train->tokens());
  if (eval != train) eval->advise(MADV_RANDOM, 0, eval->tokens());
  spdlog::info("data.path {}: {} tokens ({}), {} {} windows of {} tokens an epoch; eval: {}",
               c.path, train_end, train->describe(), train_windows, c.windows, c.context,
               eval_source);

  DatasetSplits splits;
  splits.train = std::make_shared<TokensDataset>(train, train_mask, 0, train_end, c.context, random,
                                                 vocabulary, c.train_samples);
  splits.eval =
      std::make_shared<TokensDataset>(eval, eval_mask, eval_begin, eval->tokens(), c.context,
                                      /*random=*/false, vocabulary, c.eval_samples);
  splits.input_shape = {c.context};
  splits.num_classes = vocabulary;
  return splits;
}

}  // namespace

std::string tokens_eval_file(const DataConfig& data) {
  return data.eval_path.empty() ? val_bin_beside(data.path) : data.eval_path;
}

void register_tokens_dataset(Registry& registry) { registry.add_dataset("tokens", load_tokens); }

}  // namespace gpurun

// The tokens data set (runner/src/data/tokens_dataset.cpp, token_file.h): both layouts, both
// dtypes, the bad inputs, sequential coverage, and random windows that depend on a sample's
// place in the epoch alone.
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/temp_dir.h"

#include "builtin.h"
#include "data/token_file.h"
#include "gpurun/errors.h"
#include "gpurun/registry.h"

namespace gpurun {
namespace {

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" is not in:\n" << text;
}

template <typename Id>
std::string bytes_of(const std::vector<Id>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(Id));
}

/// llm.c's header (dev/data/data_common.py): 256 int32, magic, version, token count.
std::string llmc_header(int32_t magic, int32_t version, int32_t tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = tokens;
  return bytes_of(header);
}

/// ids i % modulus for i in [0, n).
template <typename Id>
std::vector<Id> ramp(int64_t n, int64_t modulus) {
  std::vector<Id> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<Id>(i % modulus);
  return ids;
}

class Tokens : public ::testing::Test {
 protected:
  void SetUp() override { register_builtin_plugins(registry_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = tmp_ / name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  DataConfig config(const std::string& path, int64_t context = 4, int64_t vocab = 1000) {
    DataConfig c;
    c.name = "tokens";
    c.path = path;
    c.context = context;
    c.vocab_size = vocab;
    return c;
  }
  std::string error_of(const DataConfig& c) {
    try {
      registry_.make_dataset(c);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  static at::Tensor longs(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }
  static BatchContext training(int64_t epoch, std::vector<int64_t> positions) {
    return {7, epoch, longs(std::move(positions))};
  }

  test::TempDir tmp_{"tokens"};
  Registry registry_;
};

TEST_F(Tokens, RawUint16WindowsAreContextPlusOneTokensShiftedByOne) {
  // 41 tokens, context 4: (41 - 1) / 4 = 10 windows; a val.bin beside is the eval file.
  const std::string train = write("train.bin", bytes_of(ramp<uint16_t>(41, 1000)));
  write("val.bin", bytes_of(ramp<uint16_t>(9, 1000)));
  DatasetSplits s = registry_.make_dataset(config(train));
  ASSERT_EQ(s.train->size(), 10);
  EXPECT_EQ(s.eval->size(), 2);
  EXPECT_EQ(s.num_classes, 1000);
  EXPECT_EQ(s.input_shape, std::vector<int64_t>{4});
  Batch b = s.train->get(longs({0, 9}));
  EXPECT_TRUE(at::equal(b.inputs, longs({0, 1, 2, 3, 36, 37, 38, 39}).view({2, 4})));
  EXPECT_TRUE(at::equal(b.targets, longs({1, 2, 3, 4, 37, 38, 39, 40}).view({2, 4})));
  EXPECT_EQ(b.inputs.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(s.eval->get(longs({1})).targets, longs({5, 6, 7, 8}).view({1, 4})));
}

TEST_F(Tokens, RawUint32HoldsIdsAboveSixteenBits) {
  std::vector<uint32_t> ids{70000, 70001, 70002, 99999, 5, 6, 7, 8, 9, 10, 11};
  DataConfig c = config(write("t.bin", bytes_of(ids)), 2, 100000);
  c.dtype = "uint32";
  c.eval_path = write("v.bin", bytes_of(std::vector<uint32_t>{1, 2, 3}));
  DatasetSplits s = registry_.make_dataset(c);
  EXPECT_EQ(s.train->size(), 5);
  EXPECT_TRUE(at::equal(s.train->get(longs({1})).inputs, longs({70002, 99999}).view({1, 2})));
  // Read as uint16, the same bytes are other ids: 70000 = 0x11170 gives 0x1170 = 4464, 1.
  c.dtype = "uint16";
  c.vocab_size = 4000;
  EXPECT_TRUE(contains(error_of(c), "token id 4464 at token offset 0")) << error_of(c);
}

TEST_F(Tokens, LlmcHeadersAreRecognisedByTheirMagicAndGiveTheTokenizersVocabulary) {
  const std::string gpt2 =
      write("gpt2.bin", llmc_header(20240520, 1, 21) + bytes_of(ramp<uint16_t>(21, 50257)));
  DataConfig c = config(gpt2, 4, 0);  // vocab_size 0: the header's tokenizer
  c.eval_fraction = 0.25;             // no val.bin: the last 5 of 21 tokens
  DatasetSplits s = registry_.make_dataset(c);
  EXPECT_EQ(s.num_classes, 50257);
  EXPECT_EQ(s.train->size(), 3);  // 16 tokens
  EXPECT_EQ(s.eval->size(), 1);   // 5 tokens
  EXPECT_TRUE(at::equal(s.train->get(longs({0})).inputs, longs({0, 1, 2, 3}).view({1, 4})));
  EXPECT_TRUE(at::equal(s.eval->get(longs({0})).targets, longs({17, 18, 19, 20}).view({1, 4})));

  std::vector<uint32_t> big{128000, 1, 2, 3, 4, 5};
  const std::string llama = write("llama.bin", llmc_header(20240801, 7, 6) + bytes_of(big));
  DataConfig l = config(llama, 2, 0);
  l.eval_path = llama;
  s = registry_.make_dataset(l);
  EXPECT_EQ(s.num_classes, 128256);
  EXPECT_TRUE(at::equal(s.train->get(longs({0})).inputs, longs({128000, 1}).view({1, 2})));
}

TEST_F(Tokens, BadFilesAreConfigErrorsNamingTheFile) {
  const std::string odd = write("odd.bin", std::string(41, '\0'));
  std::string e = error_of(config(odd));
  EXPECT_TRUE(contains(e, odd));
  EXPECT_TRUE(contains(e, "not a whole number of 2-byte tokens")) << e;
  DataConfig c32 = config(write("odd32.bin", std::string(42, '\0')));
  c32.dtype = "uint32";
  EXPECT_TRUE(contains(error_of(c32), "not a whole number of 4-byte tokens"));

  const std::string empty = write("empty.bin", "");
  e = error_of(config(empty));
  EXPECT_TRUE(contains(e, empty + " is empty")) << e;

  const std::string header_only = write("h.bin", llmc_header(20240520, 1, 0));
  EXPECT_TRUE(contains(error_of(config(header_only)), "holds no tokens"));
  const std::string short_body =
      write("short.bin", llmc_header(20240520, 1, 100) + bytes_of(ramp<uint16_t>(99, 50)));
  e = error_of(config(short_body));
  EXPECT_TRUE(contains(e, short_body));
  EXPECT_TRUE(contains(e, "header says 100 tokens")) << e;
  const std::string version =
      write("v9.bin", llmc_header(20240520, 9, 20) + bytes_of(ramp<uint16_t>(20, 50)));
  EXPECT_TRUE(contains(error_of(config(version)), "version 9")) << error_of(config(version));

  const std::string raw = write("raw.bin", bytes_of(ramp<uint16_t>(20, 50)));
  e = error_of(config(raw, 4, 0));
  EXPECT_TRUE(contains(e, "data.vocab_size")) << e;
  EXPECT_TRUE(contains(error_of(config(raw, 40)), "fewer than data.context + 1"));
  EXPECT_TRUE(contains(error_of(config(tmp_.path())), "is a directory"));
  EXPECT_TRUE(contains(error_of(config(tmp_ / "missing.bin")), "cannot open"));
}

TEST_F(Tokens, AnIdAtOrAboveTheVocabularyIsFoundWhenReadNamingItsOffset) {
  std::vector<uint16_t> ids = ramp<uint16_t>(41, 50);
  ids[30] = 50;  // window 7 holds tokens 28..32
  const std::string path = write("train.bin", llmc_header(20240520, 1, 41) + bytes_of(ids));
  DataConfig c = config(path, 4, 50);
  c.eval_path = write("val.bin", bytes_of(ramp<uint16_t>(9, 50)));
  DatasetSplits s = registry_.make_dataset(c);  // the first window is fine
  EXPECT_NO_THROW(s.train->get(longs({0, 6, 8})));
  try {
    s.train->get(longs({1, 7}));
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, path));
    EXPECT_TRUE(contains(what, "token id 50 at token offset 30 (byte offset 1084)"));
    EXPECT_TRUE(contains(what, "vocabulary size 50"));
  }
  // In the first window it is found when the data set is set up, before training starts.
  ids[30] = 1;
  ids[2] = 60;
  write("train.bin", llmc_header(20240520, 1, 41) + bytes_of(ids));
  EXPECT_TRUE(contains(error_of(c), "token id 60 at token offset 2"));
}

TEST_F(Tokens, SequentialWindowsInAPermutationCoverEveryTokenOnce) {
  // 1001 tokens, context 8: 125 windows cover tokens [0, 1000) as inputs, each once.
  DataConfig c = config(write("t.bin", bytes_of(ramp<uint16_t>(1001, 1001))), 8, 1001);
  c.windows = "sequential";
  c.eval_path = c.path;
  DatasetSplits s = registry_.make_dataset(c);
  ASSERT_EQ(s.train->size(), 125);
  const at::Tensor order = epoch_permutation(s.train->size(), 3, 1);
  const at::Tensor positions = at::arange(s.train->size(), at::kLong);
  Batch b = s.train->get_batch(order, {3, 1, positions});
  std::vector<int64_t> seen(b.inputs.data_ptr<int64_t>(),
                            b.inputs.data_ptr<int64_t>() + b.inputs.numel());
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> all(1000);
  for (int64_t i = 0; i < 1000; ++i) all[static_cast<size_t>(i)] = i;
  EXPECT_EQ(seen, all);
}

TEST_F(Tokens, RandomWindowsDependOnSeedEpochAndPositionNotOnTheCallsGrouping) {
  DataConfig c = config(write("t.bin", bytes_of(ramp<uint16_t>(5001, 5001))), 16, 5001);
  c.eval_path = c.path;
  DatasetSplits s = registry_.make_dataset(c);
  const Dataset& d = *s.train;
  ASSERT_EQ(d.size(), 312);
  Batch both = d.get_batch(longs({3, 9}), training(2, {40, 41}));
  Batch first = d.get_batch(longs({3}), training(2, {40}));
  Batch second = d.get_batch(longs({9}), training(2, {41}));
  EXPECT_TRUE(at::equal(both.inputs, at::cat({first.inputs, second.inputs})));
  EXPECT_TRUE(at::equal(both.targets, at::cat({first.targets, second.targets})));
  // The window is the sample's place, not its index: another index at position 40, the same.
  EXPECT_TRUE(at::equal(d.get_batch(longs({200}), training(2, {40})).inputs, first.inputs));
  // A window: consecutive ids (the ramp), targets the inputs shifted by one.
  const int64_t start = first.inputs[0][0].item<int64_t>();
  EXPECT_TRUE(at::equal(first.inputs, at::arange(start, start + 16, at::kLong).view({1, 16})));
  EXPECT_TRUE(at::equal(first.targets, at::arange(start + 1, start + 17, at::kLong).view({1, 16})));
  // Offsets spread over the file, and change with the epoch and the seed.
  Batch many = d.get_batch(at::zeros({200}, at::kLong), {7, 2, at::arange(200, at::kLong)});
  std::set<int64_t> starts;
  int64_t largest = 0;
  for (int64_t i = 0; i < 200; ++i) {
    starts.insert(many.inputs[i][0].item<int64_t>());
    largest = std::max(largest, many.inputs[i][0].item<int64_t>());
  }
  EXPECT_GT(starts.size(), 190u);
  EXPECT_GT(largest, 4000);
  EXPECT_FALSE(at::equal(d.get_batch(longs({3}), training(3, {40})).inputs, first.inputs));
  EXPECT_FALSE(at::equal(d.get_batch(longs({3}), {8, 2, longs({40})}).inputs, first.inputs));
  // Evaluation (epoch -1) and get() draw nothing: the sequential window.
  EXPECT_TRUE(at::equal(d.get_batch(longs({3}), {7, -1, longs({40})}).inputs,
                        at::arange(48, 64, at::kLong).view({1, 16})));
}

TEST_F(Tokens, ConcurrentCallsGiveWhatOneThreadGets) {
  DataConfig c = config(write("t.bin", bytes_of(ramp<uint16_t>(20001, 999))), 32, 999);
  c.eval_path = c.path;
  DatasetSplits s = registry_.make_dataset(c);
  const at::Tensor idx = at::arange(64, at::kLong);
  const BatchContext ctx{1, 0, at::arange(64, at::kLong)};
  const Batch expected = s.train->get_batch(idx, ctx);
  std::vector<std::thread> threads;
  std::vector<bool> same(4, false);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      bool ok = true;
      for (int k = 0; k < 50; ++k)
        ok = ok && at::equal(s.train->get_batch(idx, ctx).inputs, expected.inputs);
      same[static_cast<size_t>(t)] = ok;
    });
  for (auto& t : threads) t.join();
  for (bool ok : same) EXPECT_TRUE(ok);
}

TEST_F(Tokens, SampleLimitsAndEvalFractionFollowTheOtherDataSets) {
  DataConfig c = config(write("t.bin", bytes_of(ramp<uint16_t>(401, 401))), 4, 401);
  c.train_samples = 10;
  c.eval_samples = 3;
  DatasetSplits s = registry_.make_dataset(c);  // eval: the last 40 tokens
  EXPECT_EQ(s.train->size(), 10);
  EXPECT_EQ(s.eval->size(), 3);
  EXPECT_EQ(s.eval->get(longs({0})).inputs[0][0].item<int64_t>(), 361);
  c.train_samples = 100;  // 361 tokens: 90 windows
  EXPECT_TRUE(contains(error_of(c), "asked for 100/3 samples")) << error_of(c);
}

/// This process's resident file-backed bytes (/proc/self/status RssFile).
int64_t resident_file_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("RssFile:", 0) == 0) return std::stoll(line.substr(8)) * 1024;
  return -1;
}

TEST_F(Tokens, TheResidentSetStaysBoundedWhileWindowsRangeOverTheWholeFile) {
  // 64 MiB of ids, in the page cache since they were just written; 4000 windows of 2 KiB
  // spread over all of it would map all of it (a fault maps a whole page-cache folio, up to
  // 2 MiB on kernels with large folios: 64 MiB mapped under the old count of 64 KiB a read).
  const std::string path = write("big.bin", bytes_of(ramp<uint16_t>(int64_t{32} << 20, 60000)));
  const int64_t before = resident_file_bytes();
  if (before < 0) GTEST_SKIP() << "no RssFile in /proc/self/status";
  TokenFile file(path, "data.path", 2, int64_t{8} << 20);
  std::vector<int64_t> window(1024);
  int64_t peak = 0;
  for (int64_t i = 0; i < 4000; ++i) {
    const int64_t start = (i * 7919 % 4000) * (file.tokens() / 4000);
    const int64_t largest = file.read(start, 1024, window.data());
    ASSERT_EQ(largest, *std::max_element(window.begin(), window.end()));
    ASSERT_EQ(window[0], start % 60000);
    peak = std::max(peak, resident_file_bytes() - before);
  }
  std::cerr << "resident file bytes above the start: peak " << peak << "\n";
  EXPECT_LT(peak, int64_t{16} << 20);
}

}  // namespace
}  // namespace gpurun

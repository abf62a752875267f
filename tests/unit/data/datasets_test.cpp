// Tests of the built-in datasets csv, text and synthetic (plugins/), through the registry as
// the trainer uses them.
#include <stdlib.h>
#include <unistd.h>

#include <ATen/ops/_unique.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "common/temp_dir.h"

#include "builtin.h"
#include "data/data_fingerprint.h"
#include "gpurun/errors.h"
#include "gpurun/registry.h"

namespace gpurun {
namespace {

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" is not in:\n" << text;
}

class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    register_builtin_plugins(registry_);
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  DataConfig config(const std::string& name, const std::string& path) {
    DataConfig c;
    c.name = name;
    c.path = path;
    return c;
  }
  /// The ConfigError message of loading `c` ("" when it loads).
  std::string error_of(const DataConfig& c) {
    try {
      registry_.make_dataset(c);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  Batch all(const Dataset& d) { return d.get(at::arange(d.size(), at::kLong)); }

  test::TempDir tmp_{"data"};
  std::string dir_;
  Registry registry_;
};

const char* const kIris =
    "sepal_length,sepal_width,species\n"
    "5.1,3.5,setosa\n"
    "7.0,3.2,versicolor\n"
    "6.3,3.3,virginica\n"
    "4.9,3.0,setosa\n"
    "6.4,3.2,\"versicolor\"\n"
    "5.8,2.7,virginica\n"
    "\n"
    "5.0,3.6,setosa\r\n"
    "6.9,3.1,versicolor\n"
    "6.5,3.0,virginica\n"
    "5.4,3.9,setosa\n";

TEST_F(DataFiles, CsvStringLabelsAreClassesInSortedOrder) {
  DataConfig c = config("csv", write("iris.csv", kIris));
  c.label = "species";
  c.eval_fraction = 0.2;
  DatasetSplits s = registry_.make_dataset(c);
  EXPECT_EQ(s.input_shape, std::vector<int64_t>{2});
  EXPECT_EQ(s.num_classes, 3);
  EXPECT_EQ(s.class_names, (std::vector<std::string>{"setosa", "versicolor", "virginica"}));
  EXPECT_EQ(s.train->size() + s.eval->size(), 10);  // the blank line is no row
  EXPECT_EQ(s.eval->size(), 2);
  Batch b = all(*s.train);
  EXPECT_EQ(b.inputs.scalar_type(), at::kFloat);
  EXPECT_EQ(b.targets.scalar_type(), at::kLong);
  // Standardised with the training split's statistics.
  EXPECT_NEAR(b.inputs.mean(0).abs().max().item<double>(), 0.0, 1e-5);
  EXPECT_NEAR(b.inputs.std(0).min().item<double>(), 1.0, 1e-5);
  // The same split every time (seeded with data.seed alone).
  EXPECT_TRUE(at::equal(all(*registry_.make_dataset(c).eval).targets, all(*s.eval).targets));
}

TEST_F(DataFiles, CsvIntegerLabelsByIndexWithoutHeaderAndSeparateEvalFile) {
  DataConfig c = config("csv", write("train.tsv", "0\t1.5\t2\n3\t-2e1\t+4\n1\t0.25\t6\n"));
  c.eval_path = write("eval.tsv", "4\t1\t2\n");
  c.delimiter = "tab";
  c.header = false;
  c.label = "0";
  DatasetSplits s = registry_.make_dataset(c);
  EXPECT_EQ(s.num_classes, 5);  // the largest label, 4 (in the evaluation file), + 1
  EXPECT_TRUE(s.class_names.empty());
  EXPECT_EQ(s.train->size(), 3);
  EXPECT_EQ(all(*s.train).targets[0].item<int64_t>(), 0);
  EXPECT_EQ(all(*s.train).targets[1].item<int64_t>(), 3);
  EXPECT_EQ(all(*s.train).targets[2].item<int64_t>(), 1);
  EXPECT_EQ(all(*s.eval).targets[0].item<int64_t>(), 4);
}

TEST_F(DataFiles, CsvMalformedRowsNameFileLineAndProblem) {
  const std::string path = write("bad.csv", "a,b,label\n1,2,x\n3,4\n");
  DataConfig c = config("csv", path);
  std::string e = error_of(c);
  EXPECT_TRUE(contains(e, path + ":3:")) << e;
  EXPECT_TRUE(contains(e, "2 fields, expected 3")) << e;

  c.path = write("nan.csv", "a,b,label\n1,2,x\n1,2,y\n1,2,y\n\n1,two,x\n");
  e = error_of(c);
  EXPECT_TRUE(contains(e, c.path + ":6:")) << e;
  EXPECT_TRUE(contains(e, "column 1 (b)")) << e;
  EXPECT_TRUE(contains(e, "\"two\" is not a finite number")) << e;

  c.path = write("quote.csv", "a,label\n1,\"open\n2,x\n");
  EXPECT_TRUE(contains(error_of(c), c.path + ":2: a quoted field is never closed"));

  c.path = write("ok.csv", "a,label\n1,x\n2,y\n");
  c.label = "species";
  e = error_of(c);
  EXPECT_TRUE(contains(e, "data.label: no column \"species\"")) << e;
  EXPECT_TRUE(contains(e, "columns: a, label")) << e;
}

TEST_F(DataFiles, TextTargetsAreTheNextCharacters) {
  // 26 letters repeated: 260 characters, 10% held out for evaluation.
  std::string text;
  for (int i = 0; i < 10; ++i) text += "abcdefghijklmnopqrstuvwxyz";
  DataConfig c = config("text", write("abc.txt", text));
  c.context = 8;
  c.stride = 3;
  DatasetSplits s = registry_.make_dataset(c);
  EXPECT_EQ(s.num_classes, 26);
  EXPECT_EQ(s.class_names.front(), "a");
  EXPECT_EQ(s.input_shape, std::vector<int64_t>{8});
  EXPECT_EQ(s.train->size(), (234 - 8 - 1) / 3 + 1);
  EXPECT_EQ(s.eval->size(), (26 - 8 - 1) / 8 + 1);
  Batch b = s.train->get(at::arange(2, 4, at::kLong));  // samples 2 and 3 start at 6 and 9
  ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(b.inputs.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(b.inputs[0], at::arange(6, 14, at::kLong)));
  EXPECT_TRUE(at::equal(b.targets[0], at::arange(7, 15, at::kLong)));
  EXPECT_TRUE(at::equal(b.inputs[1], at::arange(9, 17, at::kLong)));

  c.train_samples = 5;
  EXPECT_EQ(registry_.make_dataset(c).train->size(), 5);
  c.context = 300;
  EXPECT_TRUE(contains(error_of(c), "fewer than data.context + 1"));
}

TEST_F(DataFiles, TextCharactersAreCodePointsInSortedOrder) {
  DataConfig c = config("text", write("u.txt", "h\u00e9llo w\u00f6rld, \u00e9t\u00e9 \u2014 ok\n"));
  c.context = 4;
  c.eval_fraction = 0.3;
  DatasetSplits s = registry_.make_dataset(c);
  std::vector<std::string> expected{"\n", " ", ",", "d", "h",      "k",      "l",
                                    "o",  "r", "t", "w", "\u00e9", "\u00f6", "\u2014"};
  EXPECT_EQ(s.class_names, expected);
  EXPECT_EQ(s.num_classes, 14);

  c.path = write("bad.txt", "line one\nline two \xff\n");
  const std::string e = error_of(c);
  EXPECT_TRUE(contains(e, c.path + ":2: invalid UTF-8")) << e;
  EXPECT_TRUE(contains(e, "0xFF at column 10")) << e;
}

TEST_F(DataFiles, SyntheticIsDeterministicAndFollowsTheSeed) {
  DataConfig c = config("synthetic", "");
  c.samples = 200;
  c.shape = {3, 4, 4};
  c.classes = 5;
  c.eval_fraction = 0.25;
  DatasetSplits a = registry_.make_dataset(c), b = registry_.make_dataset(c);
  EXPECT_EQ(a.train->size(), 150);
  EXPECT_EQ(a.eval->size(), 50);
  EXPECT_EQ(a.input_shape, (std::vector<int64_t>{3, 4, 4}));
  EXPECT_EQ(a.num_classes, 5);
  Batch x = all(*a.train), y = all(*b.train);
  EXPECT_EQ(x.inputs.sizes(), (std::vector<int64_t>{150, 3, 4, 4}));
  EXPECT_TRUE(at::equal(x.inputs, y.inputs));
  EXPECT_TRUE(at::equal(x.targets, y.targets));
  EXPECT_EQ(std::get<0>(at::_unique(x.targets)).numel(), 5);
  c.seed = 1;
  EXPECT_FALSE(at::equal(all(*registry_.make_dataset(c).train).inputs, x.inputs));
}

}  // namespace
}  // namespace gpurun

namespace gpurun {
namespace {

// Issue 40, item 6: the data's fingerprint names what changed, file by file where the folder
// is small; a newer mtime alone is not a change.
TEST(DataFingerprint, NamesFilesAddedRemovedAndResizedAndTellsATouchFromAChange) {
  test::TempDir tmp{"fingerprint"};
  const std::string dir = tmp.path() + "/images";
  std::filesystem::create_directories(dir + "/cat");
  std::ofstream(dir + "/cat/a.png") << "aaaa";
  std::ofstream(dir + "/cat/b.png") << "bb";
  DataConfig data;
  data.name = "image_folder";
  data.path = dir;
  const DataFingerprint before = fingerprint_data(data, 2, 0);
  ASSERT_EQ(before.sources.size(), 1u);
  EXPECT_EQ(before.sources[0].files, 2);
  EXPECT_EQ(before.sources[0].bytes, 6);
  // Through the manifest's JSON and back.
  const DataFingerprint saved = DataFingerprint::from_json(before.to_json());
  EXPECT_TRUE(compare_data(saved, fingerprint_data(data, 2, 0)).changes.empty());

  // The same bytes written again later: touched, not changed.
  ::usleep(20000);
  std::ofstream(dir + "/cat/b.png") << "bb";
  DataChange c = compare_data(saved, fingerprint_data(data, 2, 0));
  EXPECT_TRUE(c.changes.empty());
  ASSERT_EQ(c.touched.size(), 1u);
  EXPECT_EQ(c.touched[0], "data.path " + dir);

  std::ofstream(dir + "/cat/c.png") << "c";
  std::filesystem::remove(dir + "/cat/a.png");
  std::ofstream(dir + "/cat/b.png") << "bbbbb";
  c = compare_data(saved, fingerprint_data(data, 3, 0));
  ASSERT_EQ(c.changes.size(), 2u);
  EXPECT_EQ(c.changes[0], "training samples: 3, was 2");
  EXPECT_EQ(c.changes[1], "data.path " + dir +
                              ": 1 added: cat/c.png; 1 removed: cat/a.png; changed size: "
                              "cat/b.png 5 bytes, was 2");
  // A source read before and not now (data.eval_path dropped), and the synthetic set's none.
  DataConfig with_eval = data;
  with_eval.eval_path = dir;
  c = compare_data(fingerprint_data(with_eval, 3, 1), fingerprint_data(data, 3, 1));
  ASSERT_EQ(c.changes.size(), 1u);
  EXPECT_EQ(c.changes[0], "data.eval_path " + dir + ": read by the checkpoint's run, not now");
  data.name = "synthetic";
  EXPECT_TRUE(fingerprint_data(data, 3, 1).sources.empty());
}

}  // namespace
}  // namespace gpurun

// data.name tokens end to end (issue 30, "Tokens" and "Bad input"): a token file made from the
// King James Bible, one token per byte as uint16, trains the gpt with --memory-limit below the
// file's size and a resident set that does not grow with the file; a SIGKILL and --resume give
// the uninterrupted digest; sequential windows visit every token once per epoch; every bad file
// exits 2 naming it, before anything is written to --ckpt.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

const std::string kKjv = "/usr/local/share/gpurun/kjv.txt";  // scripts/install-deps.sh

/// The King James Bible's text (4.3 MB): the file install-deps writes, else Debian's reader.
std::string kjv() {
  std::string text = slurp(kKjv);
  if (text.empty() && access("/usr/bin/bible", X_OK) == 0)
    text = run_program({"/usr/bin/bible", "-l100000", "Gen1:1-Rev22:21"}).out;
  return text;
}

/// `bytes` as uint16 tokens, one per byte, `repeats` times over, written to `path`.
void write_tokens(const std::string& path, const std::string& bytes, int repeats = 1) {
  std::vector<uint16_t> ids(bytes.begin(), bytes.end());
  for (size_t i = 0; i < bytes.size(); ++i) ids[i] = static_cast<unsigned char>(bytes[i]);
  std::ofstream out(path, std::ios::binary);
  for (int r = 0; r < repeats; ++r)
    out.write(reinterpret_cast<const char*>(ids.data()),
              static_cast<std::streamsize>(ids.size() * sizeof(uint16_t)));
}

/// A tiny GPT on the token files `dir`/train.bin (and val.bin beside it), byte vocabulary;
/// `data_extra` adds keys to data (data.context among them).
std::string tokens_config(const TempDir& dir, const std::string& data_extra) {
  return write_config(dir,
                      "model: {name: gpt, layers: 2, heads: 2, width: 32, dropout: 0.1}\n"
                      "data: {name: tokens, path: " +
                          (dir / "train.bin") + ", vocab_size: 256" + data_extra +
                          "}\n"
                          "optim: {name: adamw, lr: 0.002}\n"
                          "train: {epochs: 2, batch_size: 16, eval_batch_size: 32, seed: 1, "
                          "threads: 1}\n"
                          "checkpoint: {every_steps: 5, async: false}\n"
                          "log: {every_steps: 1}\n");
}

/// Every entry under `dir`, "" when there is none (or no `dir`).
std::string entries_of(const std::string& dir) {
  std::string names;
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return names;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
    names += e.path().string() + "\n";
  return names;
}

class TokensRun : public ::testing::Test {
 protected:
  void SetUp() override {
    text_ = kjv();
    if (text_.size() < 4000000) GTEST_SKIP() << "no KJV text: run scripts/install-deps.sh";
  }
  std::string text_;
};

TEST_F(TokensRun, AFileLargerThanTheMemoryLimitTrainsWithAResidentSetThatDoesNotGrowWithIt) {
  // The same run on the KJV once (8.6 MB of uint16) and 24 times over (206 MB), with
  // --memory-limit 64MiB: every window of the epoch's permutation is anywhere in the file, and
  // a stop after 12 steps ends the run (75) with its checkpoint.
  int64_t rss[2] = {0, 0};
  const int repeats[2] = {1, 24};
  for (int k = 0; k < 2; ++k) {
    TempDir dir;
    write_tokens(dir / "train.bin", text_, repeats[k]);
    write_tokens(dir / "val.bin", text_.substr(0, 100000));
    const int64_t bytes = static_cast<int64_t>(std::filesystem::file_size(dir / "train.bin"));
    if (k == 1) {
      ASSERT_GT(bytes, 3 * (int64_t{64} << 20));
    }
    const std::string config = tokens_config(dir, ", context: 64, eval_samples: 32");
    Result r = run_gpurun({config, "--ckpt", dir / "ckpt", "--memory-limit", "64MiB"},
                          {{"GPURUN_FAULT", "sigterm:after_step:12"}});
    ASSERT_EQ(r.exit_code, 75) << r.err;
    EXPECT_EQ(inspect(dir / "ckpt").value("global_step", -1), 12);
    const auto steps = events(dir / "ckpt", "step");
    ASSERT_EQ(steps.size(), 12u);
    EXPECT_LT(steps.back()["loss"].get<double>(), steps.front()["loss"].get<double>());
    rss[k] = r.max_rss_bytes;
    std::cerr << "tokens: " << bytes << "-byte file, peak resident set " << r.max_rss_bytes
              << " bytes\n";
  }
  // Read whole, the large file would add its 206 MB (412 MB as int64); its epoch permutation
  // (1.6 M windows, 13 MB) and the pages the windows touched are what it may add.
  EXPECT_LT(rss[1] - rss[0], int64_t{48} << 20) << rss[0] << " vs " << rss[1];
}

TEST_F(TokensRun, KillAndResumeGivesTheUninterruptedDigest) {
  TempDir dir;
  const size_t split = text_.size() * 9 / 10;
  write_tokens(dir / "train.bin", text_.substr(0, split));
  write_tokens(dir / "val.bin", text_.substr(split));
  // 2 epochs of 12 steps, a checkpoint every 5; killed at step 17, resumed from step 15.
  const std::string config =
      tokens_config(dir, ", context: 32, train_samples: 192, eval_samples: 32");
  Result full = run_gpurun({config, "--ckpt", dir / "full"});
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const std::string expected = inspect(dir / "full").value("model_digest", "");
  ASSERT_EQ(expected.size(), 16u);
  ASSERT_EQ(events(dir / "full", "epoch").size(), 2u);
  Result killed =
      run_gpurun({config, "--ckpt", dir / "ckpt"}, {{"GPURUN_FAULT", "sigkill:after_step:17"}});
  ASSERT_EQ(killed.signal, SIGKILL) << killed.err;
  EXPECT_EQ(inspect(dir / "ckpt").value("global_step", -1), 15);
  Result resumed = run_gpurun({config, "--ckpt", dir / "ckpt", "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(inspect(dir / "ckpt").value("model_digest", ""), expected);
}

// Issue 40, item 6: the data is fingerprinted in every manifest. train.bin grown between the
// stop and the resume (the epoch would become longer, the cosine schedule another) stops the
// resume with exit 3 naming the file and its sizes, and nothing is trained; with
// --allow-data-change it resumes, with a warning and a data_change event. A file rewritten with
// the same bytes (a newer mtime alone, as a copy made anew on another machine) resumes with a
// warning.
TEST_F(TokensRun, AResumeOverChangedDataStopsNamingTheChangeUnlessAllowed) {
  TempDir dir;
  write_tokens(dir / "train.bin", text_.substr(0, 2000 * 32 + 1));
  write_tokens(dir / "val.bin", text_.substr(100000, 2000));
  const std::string config = tokens_config(dir, ", context: 32, eval_samples: 32");
  const std::string ckpt = dir / "ckpt";
  const Result stopped =
      run_gpurun({config, "--ckpt", ckpt}, {{"GPURUN_FAULT", "sigterm:after_step:6"}});
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  const nlohmann::json data = inspect(ckpt)["extra"]["data"];
  ASSERT_TRUE(data.is_object()) << inspect(ckpt).dump();
  EXPECT_EQ(data["train_samples"], 2000);
  EXPECT_EQ(data["sources"].size(), 2u);  // train.bin, and val.bin beside it

  // The same bytes written again: newer, the same data.
  sleep_for(0.02);
  write_tokens(dir / "train.bin", text_.substr(0, 2000 * 32 + 1));
  const Result touched =
      run_gpurun({config, "--ckpt", ckpt, "--resume"}, {{"GPURUN_FAULT", "sigterm:after_step:8"}});
  ASSERT_EQ(touched.exit_code, 75) << touched.err;
  EXPECT_TRUE(contains(touched.err, "by name and size, but newer")) << touched.err;

  // 1000 windows more: refused, nothing trained, nothing written.
  write_tokens(dir / "train.bin", text_.substr(0, 3000 * 32 + 1));
  const std::string latest = slurp(ckpt + "/LATEST");
  const size_t logged = events(ckpt, "step").size();
  const Result refused = run_gpurun({config, "--ckpt", ckpt, "--resume"});
  EXPECT_EQ(refused.exit_code, 3) << refused.err;
  EXPECT_TRUE(contains(refused.err, "the data changed since the checkpoint was written"))
      << refused.err;
  EXPECT_TRUE(contains(refused.err, "data.path " + (dir / "train.bin") +
                                        ": changed size: train.bin 192002 bytes, was 128002"))
      << refused.err;
  EXPECT_TRUE(contains(refused.err, "training samples: 3000, was 2000")) << refused.err;
  EXPECT_TRUE(contains(refused.err, "--allow-data-change")) << refused.err;
  EXPECT_FALSE(contains(refused.err, "probing")) << refused.err;
  EXPECT_EQ(slurp(ckpt + "/LATEST"), latest);
  EXPECT_EQ(events(ckpt, "step").size(), logged);

  const Result allowed = run_gpurun({config, "--ckpt", ckpt, "--resume", "--allow-data-change"});
  ASSERT_EQ(allowed.exit_code, 0) << allowed.err;
  EXPECT_TRUE(contains(allowed.err, "--allow-data-change: resuming")) << allowed.err;
  const auto changes = events(ckpt, "data_change");
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0]["changes"].size(), 2u) << changes[0];
  // The checkpoints from here on record the new data.
  EXPECT_EQ(inspect(ckpt)["extra"]["data"]["train_samples"], 3000);
}

TEST_F(TokensRun, SequentialWindowsVisitEveryTokenOncePerEpoch) {
  TempDir dir;
  // 96 windows of 32 tokens and the one token after the last: 6 steps of 16 an epoch.
  write_tokens(dir / "train.bin", text_.substr(0, 96 * 32 + 1));
  write_tokens(dir / "val.bin", text_.substr(100000, 1000));
  const std::string config = tokens_config(dir, ", context: 32, windows: sequential");
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt"}, {{"GPURUN_TRACE_SAMPLES", dir / "t"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // "STEP EPOCH i i i ...": sample i is the window of tokens [32 i, 32 i + 32) (and its target
  // 32 i + 32), so an epoch's samples, each once, are its tokens [0, 3072), each once.
  std::vector<std::vector<int64_t>> tokens(2);
  std::vector<std::vector<int64_t>> order(2);
  std::istringstream lines(slurp(dir / "t"));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    int64_t step = 0, epoch = 0, i = 0;
    fields >> step >> epoch;
    ASSERT_LT(epoch, 2);
    while (fields >> i) {
      order[epoch].push_back(i);
      for (int64_t t = 32 * i; t < 32 * i + 32; ++t) tokens[epoch].push_back(t);
    }
  }
  for (auto& epoch : tokens) {
    std::sort(epoch.begin(), epoch.end());
    ASSERT_EQ(epoch.size(), 3072u);
    for (size_t t = 0; t < epoch.size(); ++t) ASSERT_EQ(epoch[t], static_cast<int64_t>(t));
  }
  EXPECT_NE(order[0], order[1]) << "each epoch has its own permutation";
}

TEST_F(TokensRun, DataStageCopiesTheValBinBesideDataPathWithIt) {
  // data.stage_dir: the default eval file (val.bin beside data.path) is staged too, and the run
  // evaluates on the staged copy, not on a held-out share of the staged train.bin.
  TempDir dir;
  const std::string nas = dir / "nas", stage = dir / "stage";
  std::filesystem::create_directories(nas);
  write_tokens(nas + "/train.bin", text_.substr(0, 20000));
  write_tokens(nas + "/val.bin", text_.substr(20000, 2000));
  const std::string config =
      tokens_config(dir, ", context: 32, train_samples: 32, eval_samples: 16");
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt", "--set", "data.path=" + nas + "/train.bin",
                         "--set", "data.stage_dir=" + stage, "--set", "train.epochs=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "staged data.path " + nas + "/train.bin")) << r.err;
  EXPECT_TRUE(contains(r.err, "staged data.eval_path " + nas + "/val.bin")) << r.err;
  EXPECT_TRUE(contains(r.err, "eval: " + stage)) << r.err;
  EXPECT_FALSE(contains(r.err, "data.eval_fraction; no data.eval_path")) << r.err;
}

struct BadInput {
  const char* what;
  std::string bytes;      // train.bin
  std::string expected;   // in the message, besides the file's name
  bool checked_at_start;  // else found when read: no checkpoint is written, the lease may be
};

TEST_F(TokensRun, EachBadInputExitsTwoNamingTheFileBeforeAnythingIsWritten) {
  std::vector<uint16_t> header(512, 0);  // llm.c's 256 int32s
  const int32_t magic = 20240520, version = 1, count = 5000;
  std::memcpy(header.data(), &magic, 4);
  std::memcpy(header.data() + 2, &version, 4);
  std::memcpy(header.data() + 4, &count, 4);
  const std::string head(reinterpret_cast<const char*>(header.data()), 1024);
  std::string ids;
  for (unsigned char ch : text_.substr(0, 4000)) ids += std::string{static_cast<char>(ch), '\0'};
  std::string late = ids;
  late[2 * 3001] = late[2 * 3001 + 1] = '\1';  // token 3001: 257, in window 93 of 124
  const std::vector<BadInput> cases{
      {"odd size", ids + "x", "not a whole number of 2-byte tokens", true},
      {"empty", "", "is empty", true},
      {"header count", head + ids, "header says 5000 tokens", true},
      {"first window", std::string("\0\1", 2) + ids, "token id 256 at token offset 0", true},
      {"late token", late, "token id 257 at token offset 3001 (byte offset 6002)", false},
  };
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir dir;
    std::ofstream(dir / "train.bin", std::ios::binary) << c.bytes;
    write_tokens(dir / "val.bin", text_.substr(0, 1000));
    const std::string config = tokens_config(dir, ", context: 32, windows: sequential");
    const std::string ckpt = dir / "ckpt";
    // Saved at the epoch's end only: the late token is read before.
    Result r = run_gpurun({config, "--ckpt", ckpt, "--set", "checkpoint.every_steps=0"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, dir / "train.bin")) << r.err;
    EXPECT_TRUE(contains(r.err, c.expected)) << r.err;
    if (c.checked_at_start) {
      EXPECT_EQ(entries_of(ckpt), "");
    } else {
      EXPECT_FALSE(std::filesystem::exists(dir / "ckpt/LATEST")) << entries_of(ckpt);
    }
  }
}

}  // namespace
}  // namespace gpurun::test

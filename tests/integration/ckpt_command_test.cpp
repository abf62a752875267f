// `gpurun ckpt`, `gpurun export` and a resume with the real binary on a damaged checkpoint
// directory (issue 16, defects 4, 7 and 11): one unreadable file fails only its checkpoint,
// --json is one object also on errors, `export --to DIR` is refused, and LATEST's bytes never
// reach the terminal raw.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const kNewest = "ckpt-e0001-s0000010";
const char* const kPrevious = "ckpt-e0000-s0000008";

/// Trains 10 steps into DIR/ckpt with a checkpoint every 4 steps (steps 4, 8 and 10 kept);
/// returns the config's path.
std::string train(const TempDir& dir) {
  const std::string config = write_config(dir, small_config(300, 30, 1));
  const Result r =
      run_gpurun({config, "--ckpt", dir / "ckpt", "--set", "checkpoint.every_steps=4"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_directory(dir / "ckpt" + "/" + kNewest)) << r.err;
  return config;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

/// Replaces CHECKPOINT/model.pt by a directory.
void make_model_a_directory(const std::string& checkpoint) {
  fs::remove(checkpoint + "/model.pt");
  fs::create_directories(checkpoint + "/model.pt");
}

/// Parses the whole of `out` as one JSON object (json::parse refuses anything after it); an
/// empty object, and a test failure, when it is not one.
json one_object(const std::string& out) {
  json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(j.is_object()) << "not one JSON object:\n" << out;
  return j.is_object() ? j : json::object();
}

bool has_raw_terminal_bytes(const std::string& text) {
  for (const char c : {'\0', '\xff', '\x1b'}) {
    if (text.find(c) != std::string::npos) return true;
  }
  return false;
}

// Issue 31, item 8: the text of `ckpt inspect` left out the manifest's extra (the precision,
// the model's source, init_from, ...), which only --json showed.
TEST(CkptCommand, InspectsTextShowsTheManifestsExtra) {
  TempDir dir;
  train(dir);
  const json manifest = inspect(dir / "ckpt");
  ASSERT_TRUE(manifest.contains("extra") && manifest["extra"].is_object()) << manifest.dump();
  ASSERT_TRUE(manifest["extra"].contains("precision")) << manifest["extra"].dump();
  const Result r = run_gpurun({"ckpt", "inspect", dir / "ckpt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "\n  extra\n")) << r.out;
  std::istringstream lines(r.out);
  bool precision = false;
  for (std::string line; std::getline(lines, line);)
    precision = precision || (line.rfind("    precision ", 0) == 0 &&
                              contains(line, manifest["extra"]["precision"].get<std::string>()));
  EXPECT_TRUE(precision) << r.out;
}

TEST(CkptCommand, AFileReplacedByADirectoryFailsOnlyItsCheckpoint) {
  TempDir dir;
  train(dir);
  const std::string ckpt = dir / "ckpt";
  make_model_a_directory(ckpt + "/" + kNewest);

  // Issue 31, item 3: the one a resume would take is not the newest: exit 1, for `|| alert`.
  Result r = run_gpurun({"ckpt", "verify", ckpt});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, std::string("FAILED  ") + kNewest + ": model.pt: not a regular file"))
      << r.out << r.err;
  EXPECT_TRUE(contains(r.out, std::string("ok      ") + kPrevious)) << r.out;
  EXPECT_TRUE(contains(r.out, std::string("newest complete checkpoint: ") + kPrevious)) << r.out;

  r = run_gpurun({"ckpt", "verify", ckpt, "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  json j = one_object(r.out);
  EXPECT_EQ(j.value("ok", true), false);
  EXPECT_EQ(j.value("failed", 0), 1);
  EXPECT_EQ(j.value("newest_complete", ""), kPrevious);

  r = run_gpurun({"ckpt", "inspect", ckpt});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, std::string("skipping ") + kNewest)) << r.err;
  EXPECT_TRUE(contains(r.out, std::string("checkpoint ") + ckpt + "/" + kPrevious)) << r.out;

  r = run_gpurun({"ckpt", "inspect", ckpt, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(one_object(r.out).value("global_step", -1), 8);

  // Issue 31, item 3b: export refuses an older state than the newest unless it is chosen.
  r = run_gpurun({"export", ckpt, "--to", dir / "model.pt"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "the newest checkpoint " + ckpt + "/" + kNewest +
                                  " (global step 10) does not verify (model.pt: not a regular "
                                  "file); the newest that verifies is " +
                                  ckpt + "/" + kPrevious +
                                  " (global step 8): export it with "
                                  "--step 8"))
      << r.err;
  EXPECT_FALSE(fs::exists(dir / "model.pt"));
  r = run_gpurun({"export", ckpt, "--to", dir / "model.pt", "--step", "8"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, std::string(kPrevious) + " (global step 8")) << r.out;
  r = run_gpurun({"export", ckpt + "/" + kPrevious, "--to", dir / "model.pt"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_gpurun({"export", ckpt, "--to", dir / "model.pt", "--step", "10"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "the checkpoint of global step 10 in " + ckpt + " does not verify"))
      << r.err;
  r = run_gpurun({"export", ckpt, "--to", dir / "model.pt", "--step", "9"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "no checkpoint of global step 9")) << r.err;
  EXPECT_TRUE(fs::is_directory(ckpt + "/" + kNewest + "/model.pt"))
      << "a read-only command renamed it";
}

// Issue 31, item 2: one change in manifest.json (the epoch 1 -> 0) is damage like any other:
// verify names it (exit 1), and a resume sets it aside and takes the previous checkpoint, from
// which it trains again to the same weights.
TEST(CkptCommand, AnEditedManifestFailsVerifyAndAResumeTakesThePreviousCheckpoint) {
  TempDir dir;
  const std::string config = train(dir);
  const std::string ckpt = dir / "ckpt";
  const std::string newest = ckpt + "/" + kNewest;
  const std::string digest = inspect(ckpt).value("model_digest", "");
  std::string text = slurp(newest + "/manifest.json");
  ASSERT_TRUE(contains(text, "\"epoch\": 1,")) << text;
  text.replace(text.find("\"epoch\": 1,"), 11, "\"epoch\": 0,");
  write_bytes(newest + "/manifest.json", text);

  Result r = run_gpurun({"ckpt", "verify", ckpt});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, std::string("FAILED  ") + kNewest + ": manifest.json: its own xxh3"))
      << r.out;
  r = run_gpurun({"ckpt", "list", ckpt});
  EXPECT_TRUE(contains(r.out, "DAMAGED: manifest.json: its own xxh3")) << r.out;

  r = run_gpurun({config, "--ckpt", ckpt, "--resume", "--set", "checkpoint.every_steps=4"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "resuming from " + ckpt + "/" + kPrevious)) << r.err;
  const std::vector<json> resumes = events(ckpt, "resume");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_EQ(resumes[0].value("global_step", -1), 8);
  EXPECT_TRUE(fs::is_directory(newest + ".damaged"));
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""), digest);
  EXPECT_EQ(run_gpurun({"ckpt", "verify", ckpt}).exit_code, 0);
}

TEST(CkptCommand, JsonIsOneObjectAlsoWhenNothingVerifies) {
  TempDir dir;
  train(dir);
  const std::string ckpt = dir / "ckpt";
  for (const auto& e : fs::directory_iterator(ckpt)) {
    if (e.path().filename().string().rfind("ckpt-", 0) == 0) make_model_a_directory(e.path());
  }
  Result r = run_gpurun({"ckpt", "verify", ckpt, "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  json j = one_object(r.out);
  EXPECT_EQ(j.value("ok", true), false);
  EXPECT_EQ(j["checkpoints"].size(), 3u);

  // An error (exit 3: nothing to inspect) still prints one object, naming it.
  r = run_gpurun({"ckpt", "inspect", ckpt, "--json"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  j = one_object(r.out);
  EXPECT_EQ(j.value("exit_code", 0), 3);
  EXPECT_TRUE(contains(j.value("error", ""), "no complete checkpoint in " + ckpt)) << r.out;
  // A folder whose manifest is readable: its manifest, exit 1.
  r = run_gpurun({"ckpt", "inspect", ckpt + "/" + kNewest, "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(one_object(r.out).value("global_step", -1), 10);
  r = run_gpurun({"ckpt", "list", dir / "missing", "--json"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(one_object(r.out).value("exit_code", 0), 2);

  r = run_gpurun({"export", ckpt, "--to", dir / "model.pt"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "no checkpoint there verifies")) << r.err;
}

TEST(Export, ToADirectoryExitsTwoAndAnExistingFileIsReplaced) {
  TempDir dir;
  train(dir);
  const std::string ckpt = dir / "ckpt";
  fs::create_directories(dir / "out");
  for (const std::string& to : {dir / "out", dir / "out/", dir / "new/"}) {
    const Result r = run_gpurun({"export", ckpt, "--to", to});
    EXPECT_EQ(r.exit_code, 2) << to << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, "--to is a directory")) << r.err;
  }
  EXPECT_TRUE(fs::is_empty(dir / "out"));
  EXPECT_FALSE(fs::exists(dir / "new"));

  write_bytes(dir / "model.pt", "not a model");
  const Result r = run_gpurun({"export", ckpt, "--to", dir / "model.pt"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(slurp(dir / "model.pt"), slurp(ckpt + "/" + kNewest + "/model.pt"));

  const Result help = run_gpurun({"--help"});
  EXPECT_TRUE(contains(help.out, "an existing file is replaced")) << help.out;
}

TEST(Latest, GarbageIsEscapedAndAMissingOneIsCalledMissing) {
  TempDir dir;
  const std::string config = train(dir);
  const std::string ckpt = dir / "ckpt";
  const std::string garbage("ckpt-\0\xff\n\x1b[2J", 12);
  const std::string escaped = R"(LATEST names "ckpt-\x00\xff\n\x1b[2J")";
  write_bytes(ckpt + "/LATEST", garbage + "\n");

  Result r = run_gpurun({"ckpt", "list", ckpt});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, escaped + ", which is not here")) << r.out;
  EXPECT_FALSE(has_raw_terminal_bytes(r.out)) << r.out;
  r = run_gpurun({"ckpt", "list", ckpt, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(one_object(r.out)["checkpoints"].size(), 3u);

  const std::vector<std::string> resume{config,     "--ckpt", ckpt,
                                        "--resume", "--set",  "checkpoint.every_steps=4"};
  r = run_gpurun(resume);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, escaped + ", but the newest complete checkpoint is " + kNewest))
      << r.err;
  EXPECT_FALSE(has_raw_terminal_bytes(r.err)) << r.err;
  EXPECT_EQ(slurp(ckpt + "/LATEST"), std::string(kNewest) + "\n");

  fs::remove(ckpt + "/LATEST");
  r = run_gpurun({"ckpt", "list", ckpt});
  EXPECT_TRUE(contains(r.out, "LATEST is missing")) << r.out;
  r = run_gpurun(resume);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "LATEST is missing, but the newest complete checkpoint is")) << r.err;
  EXPECT_FALSE(contains(r.err, "LATEST names")) << r.err;
}

}  // namespace
}  // namespace gpurun::test

// manifest.json's own checksum and the folder name's agreement with it (issue 31, item 2;
// checkpoint/manifest.h): no byte of a manifest can change unnoticed, a damaged manifest is set
// aside like any damaged file, and a manifest of format_version 1 (no seal) still resumes.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/storage/store.h"
#include "common/temp_dir.h"
#include "gpurun/errors.h"
#include "util/fs.h"
#include "util/hash.h"

namespace {

namespace stdfs = std::filesystem;
using gpurun::CheckpointStore;
using gpurun::CheckpointView;
using nlohmann::json;

gpurun::CheckpointSnapshot snapshot(int64_t epoch, int64_t step) {
  gpurun::CheckpointSnapshot s;
  s.meta.epoch = epoch;
  s.meta.global_step = step;
  s.meta.position_in_epoch = 1664;
  s.meta.config_hash = "0123456789abcdef";
  s.meta.config = {{"train", {{"epochs", 2}}}};
  s.meta.model_digest = "6f05b8ac735235fb";
  s.meta.extra = {{"loss_sum", 0.1 + 0.2}, {"grad_scaler", {{"scale", 65536.0}}}};
  s.files = {{"model.pt", std::string(300, 'm')}, {"trainer.pt", "t" + std::to_string(step)}};
  return s;
}

// Plain bytes, no fsync: the tests below rewrite a manifest thousands of times.
void put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

class Manifest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string manifest(const std::string& name) const { return path(name + "/manifest.json"); }

  gpurun::test::TempDir tmp_{"manifest"};
  const std::string dir_ = tmp_.path() + "/ckpt";
};

TEST_F(Manifest, EndsWithTheXxh3OfEveryByteBeforeIt) {
  CheckpointStore store(dir_, 3);
  store.save(snapshot(2, 128));
  const std::string text = gpurun::fs::read_file(manifest("ckpt-e0002-s0000128"));
  const std::string tail = ",\n  \"manifest_xxh3\": \"";
  const size_t at = text.rfind(tail);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_EQ(text.substr(at + tail.size()), gpurun::xxh3_hex(text.substr(0, at)) + "\"\n}\n");
  const json m = json::parse(text);
  EXPECT_EQ(m["format_version"], 2);
  EXPECT_EQ(m.size(), 17u);  // 16 fields and the seal
  const gpurun::CheckpointInfo info = CheckpointView::inspect(path("ckpt-e0002-s0000128"), true);
  EXPECT_TRUE(info.complete) << info.problem;
  EXPECT_TRUE(info.sealed);
}

// Every one-bit change anywhere in the manifest makes its checkpoint incomplete, found by the
// quick check (sizes) a resume chooses by, not only by `gpurun ckpt verify`.
TEST_F(Manifest, EveryOneBitChangeIsFoundWithoutReadingTheFiles) {
  CheckpointStore store(dir_, 3);
  store.save(snapshot(2, 128));
  const std::string file = manifest("ckpt-e0002-s0000128");
  const std::string good = gpurun::fs::read_file(file);
  int64_t missed = 0;
  std::string first_missed;
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      put(file, bad);
      if (CheckpointView::inspect(path("ckpt-e0002-s0000128"), false).complete) {
        if (++missed == 1)
          first_missed = "byte " + std::to_string(i) + " bit " + std::to_string(bit);
      }
    }
  }
  EXPECT_EQ(missed, 0) << "first: " << first_missed;
  put(file, good);
  EXPECT_TRUE(CheckpointView::inspect(path("ckpt-e0002-s0000128"), false).complete);
}

// The edits: "epoch": 2 -> 0, and position_in_epoch 1664 -> 1665. A resume sets the
// checkpoint aside and takes the previous one; `gpurun ckpt verify` names it.
TEST_F(Manifest, AnEditedManifestIsSetAsideAndThePreviousCheckpointResumed) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"epoch\": 2,", "\"epoch\": 0,"},
           {"\"position_in_epoch\": 1664,", "\"position_in_epoch\": 1665,"}}) {
    stdfs::remove_all(dir_);
    CheckpointStore store(dir_, 3);
    store.save(snapshot(1, 64));
    store.save(snapshot(2, 128));
    const std::string file = manifest("ckpt-e0002-s0000128");
    std::string text = gpurun::fs::read_file(file);
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(), to);
    put(file, text);

    const gpurun::CheckpointInfo info = CheckpointView::inspect(path("ckpt-e0002-s0000128"), true);
    EXPECT_FALSE(info.complete) << to;
    EXPECT_NE(info.problem.find("its own xxh3"), std::string::npos) << info.problem;
    const auto loaded = store.load_latest(/*verify=*/false);
    ASSERT_TRUE(loaded.has_value());
    EXPECT_EQ(loaded->info.name, "ckpt-e0001-s0000064") << to;
    EXPECT_EQ(loaded->meta.global_step, 64);
    EXPECT_TRUE(stdfs::is_directory(path("ckpt-e0002-s0000128.damaged"))) << to;
  }
}

// A manifest sealed again after the edit (a tool that rewrites it) still disagrees with its
// folder's name; so does a folder renamed to another step.
TEST_F(Manifest, TheFolderNamesEpochAndStepMustAgreeWithIt) {
  CheckpointStore store(dir_, 3);
  store.save(snapshot(2, 128));
  gpurun::CheckpointSnapshot other = snapshot(0, 128);
  CheckpointStore(tmp_.path() + "/other", 3).save(other);
  put(manifest("ckpt-e0002-s0000128"),
      gpurun::fs::read_file(tmp_.path() + "/other/ckpt-e0000-s0000128/manifest.json"));
  gpurun::CheckpointInfo info = CheckpointView::inspect(path("ckpt-e0002-s0000128"), false);
  EXPECT_FALSE(info.complete);
  EXPECT_EQ(info.problem,
            "manifest.json: epoch 0, global step 128 disagree with the folder's name "
            "ckpt-e0002-s0000128");
  EXPECT_EQ(info.global_step, 128);

  stdfs::rename(tmp_.path() + "/other/ckpt-e0000-s0000128",
                tmp_.path() + "/other/ckpt-e0000-s0000129");
  info = CheckpointView::inspect(tmp_.path() + "/other/ckpt-e0000-s0000129", false);
  EXPECT_FALSE(info.complete);
  EXPECT_NE(info.problem.find("disagree"), std::string::npos) << info.problem;
  // A folder whose name is not a checkpoint name (a copy somewhere) is judged by its seal.
  stdfs::rename(tmp_.path() + "/other/ckpt-e0000-s0000129", tmp_.path() + "/other/copy");
  EXPECT_TRUE(CheckpointView::inspect(tmp_.path() + "/other/copy", true).complete);
}

// What gpurun wrote before the seal: format_version 1, the same fields, no manifest_xxh3.
std::string unsealed(const std::string& sealed_text) {
  nlohmann::ordered_json m = nlohmann::ordered_json::parse(sealed_text);
  m.erase("manifest_xxh3");
  m["format_version"] = 1;
  return m.dump(2) + "\n";
}

TEST_F(Manifest, AFormatOneManifestStillResumesWithTheNameCheckAlone) {
  CheckpointStore store(dir_, 3);
  store.save(snapshot(1, 64));
  store.save(snapshot(2, 128));
  for (const char* name : {"ckpt-e0001-s0000064", "ckpt-e0002-s0000128"})
    put(manifest(name), unsealed(gpurun::fs::read_file(manifest(name))));
  gpurun::CheckpointInfo info = CheckpointView::inspect(path("ckpt-e0002-s0000128"), true);
  EXPECT_TRUE(info.complete) << info.problem;
  EXPECT_FALSE(info.sealed);
  auto loaded = CheckpointStore(dir_, 3).load_latest(false);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->info.name, "ckpt-e0002-s0000128");

  // Its epoch changed: the name disagrees, the checkpoint is set aside.
  std::string text = gpurun::fs::read_file(manifest("ckpt-e0002-s0000128"));
  text.replace(text.find("\"epoch\": 2,"), 11, "\"epoch\": 0,");
  put(manifest("ckpt-e0002-s0000128"), text);
  loaded = CheckpointStore(dir_, 3).load_latest(false);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->info.name, "ckpt-e0001-s0000064");
  EXPECT_TRUE(stdfs::is_directory(path("ckpt-e0002-s0000128.damaged")));

  // A format 1 manifest with a seal that does not match, or a format 2 one without a seal, is
  // damaged: only format 1 may lack it.
  const std::string old = gpurun::fs::read_file(manifest("ckpt-e0001-s0000064"));
  nlohmann::ordered_json m = nlohmann::ordered_json::parse(old);
  m["manifest_xxh3"] = "0123456789abcdef";
  put(manifest("ckpt-e0001-s0000064"), m.dump(2) + "\n");
  EXPECT_FALSE(CheckpointView::inspect(path("ckpt-e0001-s0000064"), false).complete);
  m.erase("manifest_xxh3");
  m["format_version"] = 2;
  put(manifest("ckpt-e0001-s0000064"), m.dump(2) + "\n");
  info = CheckpointView::inspect(path("ckpt-e0001-s0000064"), false);
  EXPECT_FALSE(info.complete);
  EXPECT_EQ(info.problem, "manifest.json: no manifest_xxh3 as its last member");
}

// A copy to another tier carries the manifest byte for byte: its seal verifies there.
TEST_F(Manifest, ACopyToAnotherTierKeepsTheSeal) {
  CheckpointStore store(dir_, 3);
  const gpurun::SaveResult saved = store.save(snapshot(2, 128));
  CheckpointStore network(tmp_.path() + "/net", 3);
  const gpurun::SaveResult copied = network.copy_from(saved.path);
  const gpurun::CheckpointInfo info = CheckpointView::inspect(copied.path, true);
  EXPECT_TRUE(info.complete) << info.problem;
  EXPECT_TRUE(info.sealed);
}

}  // namespace

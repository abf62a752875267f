// CheckpointStore and `gpurun ckpt` on real folders in a fresh temporary directory
// (docs/architecture.md, case 7: a damaged or half-written checkpoint never blocks a resume).
#include "checkpoint/storage/store.h"
#include "checkpoint/format/shard_index.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <torch/version.h>
#include "common/temp_dir.h"

#include "cli/ckpt_command.h"
#include "gpurun/errors.h"
#include "util/fs.h"
#include "util/hash.h"

namespace {

namespace stdfs = std::filesystem;
using gpurun::CheckpointSnapshot;
using gpurun::CheckpointStore;
using gpurun::CheckpointView;
using gpurun::LatestFile;
using nlohmann::json;

using Files = std::vector<std::pair<std::string, std::string>>;

/// The files of a chosen checkpoint as a load will read them (from its folder; a load holds no
/// bytes), by the names in `like`, after checking that its manifest describes them.
Files on_disk(const gpurun::LoadedCheckpoint& loaded, const Files& like) {
  EXPECT_TRUE(loaded.files.empty()) << "a checkpoint on disk is read where it is";
  Files out;
  for (const auto& [name, bytes] : like) {
    out.emplace_back(name, gpurun::fs::read_file(loaded.info.path + "/" + name));
    const auto [size, xxh3] = loaded.expected(name);
    EXPECT_EQ(size, static_cast<int64_t>(out.back().second.size())) << name;
    EXPECT_EQ(xxh3, gpurun::xxh3_hex(out.back().second)) << name;
  }
  return out;
}

CheckpointSnapshot make_snapshot(int64_t epoch, int64_t step, size_t model_bytes = 4096) {
  CheckpointSnapshot s;
  s.meta.epoch = epoch;
  s.meta.global_step = step;
  s.meta.position_in_epoch = step * 8;
  s.meta.world_size = 2;
  s.meta.config_hash = "0123456789abcdef";
  s.meta.config = {{"train", {{"epochs", 3}, {"batch_size", 64}}}, {"model", {{"name", "mlp"}}}};
  s.meta.plan = {{"micro_batch", 16}, {"accumulation_steps", 4}};
  s.meta.model_digest = "fedcba9876543210";
  s.meta.threads = 4;
  s.meta.cpu_capability = "AVX2";
  s.meta.extra = {{"note", "test"}};
  std::string model(model_bytes, '\0');
  for (size_t i = 0; i < model.size(); ++i) model[i] = static_cast<char>(i * 7 + step);
  s.files = {{"model.pt", model},
             {"optim.pt", std::string(1000, static_cast<char>('a' + step % 26))},
             {"trainer.pt", "step " + std::to_string(step)}};
  return s;
}

class CheckpointDir : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_.path();
    dir_ = root_ + "/ckpts";
  }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : stdfs::directory_iterator(dir_)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  std::string latest() const { return gpurun::fs::read_file(path("LATEST")); }
  // Saves steps 1..n (epoch = step / 10) and returns their names.
  std::vector<std::string> save_steps(CheckpointStore& store, int n) {
    std::vector<std::string> names;
    for (int step = 1; step <= n; ++step) {
      store.save(make_snapshot(step / 10, step));
      names.push_back(gpurun::checkpoint_name(step / 10, step));
    }
    return names;
  }
  void truncate_file(const std::string& file, size_t size) {
    std::string data = gpurun::fs::read_file(file);
    data.resize(size);
    gpurun::fs::write_file(file, data);
  }
  void flip_byte(const std::string& file, size_t at) {
    std::string data = gpurun::fs::read_file(file);
    data[at] = static_cast<char>(data[at] ^ 0x01);
    gpurun::fs::write_file(file, data);
  }
  int run(const std::string& action, bool as_json, std::string* out, const std::string& dir = "") {
    std::ostringstream os;
    const int code = gpurun::ckpt_command(action, dir.empty() ? dir_ : dir, as_json, os);
    *out = os.str();
    return code;
  }

  gpurun::test::TempDir tmp_{"ckpt"};
  std::string root_, dir_;
};

TEST(CheckpointName, IsZeroPaddedEpochAndStep) {
  EXPECT_EQ(gpurun::checkpoint_name(3, 450), "ckpt-e0003-s0000450");
  EXPECT_EQ(gpurun::checkpoint_name(0, 0), "ckpt-e0000-s0000000");
}

TEST_F(CheckpointDir, SaveThenLoadReturnsTheSameBytesAndMeta) {
  CheckpointStore store(dir_, 3);
  const CheckpointSnapshot snap = make_snapshot(1, 12, 1 << 20);
  const gpurun::SaveResult saved = store.save(snap);
  EXPECT_EQ(saved.path, path("ckpt-e0001-s0000012"));
  EXPECT_EQ(saved.bytes, (1 << 20) + 1000 + 7);
  EXPECT_GE(saved.write_seconds, 0.0);
  EXPECT_TRUE(saved.removed.empty());

  const auto loaded = store.load_latest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_TRUE(loaded->info.complete);
  EXPECT_EQ(loaded->info.name, "ckpt-e0001-s0000012");
  EXPECT_EQ(loaded->info.global_step, 12);
  EXPECT_EQ(on_disk(*loaded, snap.files), snap.files);
  EXPECT_THROW(loaded->expected("other.pt"), gpurun::ResumeError);
  const gpurun::CheckpointMeta& m = loaded->meta;
  EXPECT_EQ(m.epoch, 1);
  EXPECT_EQ(m.global_step, 12);
  EXPECT_EQ(m.position_in_epoch, 96);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.config_hash, snap.meta.config_hash);
  EXPECT_EQ(m.config, snap.meta.config);
  EXPECT_EQ(m.plan, snap.meta.plan);
  EXPECT_EQ(m.model_digest, snap.meta.model_digest);
  EXPECT_EQ(m.threads, 4);
  EXPECT_EQ(m.cpu_capability, "AVX2");
  EXPECT_EQ(m.extra, snap.meta.extra);
  EXPECT_EQ(entries(), (std::vector<std::string>{"LATEST", "ckpt-e0001-s0000012"}));

  const gpurun::LoadedCheckpoint direct = CheckpointStore::load(saved.path);
  EXPECT_EQ(on_disk(direct, snap.files), snap.files);
}

TEST_F(CheckpointDir, ManifestHoldsVersionsChecksumsAndEveryMetaField) {
  CheckpointStore store(dir_, 3);
  const CheckpointSnapshot snap = make_snapshot(2, 30);
  store.save(snap);
  const std::string text = gpurun::fs::read_file(path("ckpt-e0002-s0000030/manifest.json"));
  EXPECT_EQ(text.rfind("{\n  \"format_version\": 2,", 0), 0u) << text.substr(0, 60);
  const json m = json::parse(text);
  EXPECT_EQ(m["format_version"], gpurun::kCheckpointFormatVersion);
  EXPECT_FALSE(m["gpurun_version"].get<std::string>().empty());
  EXPECT_EQ(m["torch_version"], TORCH_VERSION);
  EXPECT_TRUE(std::regex_match(m["created"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")))
      << m["created"];
  EXPECT_EQ(m["epoch"], 2);
  EXPECT_EQ(m["global_step"], 30);
  EXPECT_EQ(m["position_in_epoch"], 240);
  EXPECT_EQ(m["world_size"], 2);
  EXPECT_EQ(m["config_hash"], "0123456789abcdef");
  EXPECT_EQ(m["config"], snap.meta.config);
  EXPECT_EQ(m["plan"], snap.meta.plan);
  EXPECT_EQ(m["model_digest"], "fedcba9876543210");
  EXPECT_EQ(m["threads"], 4);
  EXPECT_EQ(m["cpu_capability"], "AVX2");
  EXPECT_EQ(m["extra"], snap.meta.extra);
  ASSERT_EQ(m["files"].size(), 3u);
  for (const auto& [name, bytes] : snap.files) {
    EXPECT_EQ(m["files"][name]["bytes"], bytes.size()) << name;
    EXPECT_EQ(m["files"][name]["xxh3"], gpurun::xxh3_hex(bytes)) << name;
    EXPECT_EQ(m["files"][name]["xxh3"].get<std::string>().size(), 16u);
  }
  const gpurun::CheckpointMeta back = gpurun::meta_from_manifest(m);
  EXPECT_EQ(back.global_step, 30);
  EXPECT_EQ(back.config, snap.meta.config);
  EXPECT_THROW(gpurun::meta_from_manifest(json{{"epoch", 1}}), gpurun::ResumeError);
}

TEST_F(CheckpointDir, LatestNamesTheNewestSave) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 2);
  EXPECT_EQ(latest(), names.back() + "\n");
}

TEST_F(CheckpointDir, RetentionKeepsExactlyTheNewestKeepLast) {
  CheckpointStore store(dir_, 2);
  for (int step = 1; step <= 4; ++step) store.save(make_snapshot(0, step));
  const gpurun::SaveResult last = store.save(make_snapshot(0, 5));
  EXPECT_EQ(last.removed, std::vector<std::string>{"ckpt-e0000-s0000003"});
  EXPECT_EQ(entries(),
            (std::vector<std::string>{"LATEST", "ckpt-e0000-s0000004", "ckpt-e0000-s0000005"}));
  const auto listed = store.list(true);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_TRUE(listed[0].complete && listed[1].complete);
  EXPECT_EQ(listed[1].global_step, 5);
}

TEST_F(CheckpointDir, TruncatedNewestFallsBackToThePreviousAndIsSetAside) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 3);
  truncate_file(path(names[2] + "/model.pt"), 1000);
  EXPECT_EQ(store.list(false)[2].problem, "model.pt: size 1000 != 4096 in manifest");

  const auto loaded = store.load_latest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->info.name, names[1]);
  EXPECT_EQ(on_disk(*loaded, make_snapshot(0, 2).files), make_snapshot(0, 2).files);
  EXPECT_FALSE(stdfs::exists(path(names[2])));
  EXPECT_TRUE(stdfs::exists(path(names[2] + ".damaged/model.pt")));
  EXPECT_EQ(latest(), names[1] + "\n");  // corrected to what was loaded
  // Its name can be reused: a new save of that step is complete and loadable.
  store.save(make_snapshot(0, 3));
  EXPECT_EQ(store.load_latest()->info.name, names[2]);
}

TEST_F(CheckpointDir, FlippedByteIsFoundByChecksumAndFallsBack) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 2);
  flip_byte(path(names[1] + "/optim.pt"), 500);
  EXPECT_TRUE(store.list(false)[1].complete);  // sizes alone cannot see it
  const auto verified = store.list(true);
  EXPECT_FALSE(verified[1].complete);
  EXPECT_EQ(verified[1].problem.rfind("optim.pt: xxh3 mismatch", 0), 0u) << verified[1].problem;

  const auto loaded = store.load_latest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->info.name, names[0]);
  EXPECT_TRUE(stdfs::is_directory(path(names[1] + ".damaged")));
  EXPECT_THROW(CheckpointStore::load(path(names[1] + ".damaged")), gpurun::ResumeError);
}

TEST_F(CheckpointDir, AllDamagedThrowsResumeErrorNamingEachOne) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 2);
  stdfs::create_directories(path(names[1] + ".damaged"));  // taken: the next is .damaged.1
  truncate_file(path(names[0] + "/trainer.pt"), 2);
  flip_byte(path(names[1] + "/model.pt"), 0);
  try {
    store.load_latest();
    FAIL() << "no exception";
  } catch (const gpurun::ResumeError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(names[0] + " (trainer.pt: size 2 != 6 in manifest"), std::string::npos)
        << what;
    EXPECT_NE(what.find(names[1] + " (model.pt: xxh3 mismatch"), std::string::npos) << what;
    EXPECT_NE(what.find(names[1] + ".damaged.1"), std::string::npos) << what;
  }
  EXPECT_FALSE(store.has_checkpoints());
  EXPECT_TRUE(stdfs::is_directory(path(names[0] + ".damaged")));
}

TEST_F(CheckpointDir, LeftoverTemporariesAreIgnoredAndCleaned) {
  CheckpointStore store(dir_, 3);
  store.save(make_snapshot(0, 1));
  stdfs::create_directories(path(".tmp-ckpt-e0000-s0000002-99999"));
  gpurun::fs::write_file(path(".tmp-ckpt-e0000-s0000002-99999/model.pt"), "half");
  stdfs::create_directories(path(".tmp-del-ckpt-e0000-s0000000-99999"));
  gpurun::fs::write_file(path(".LATEST.tmp-99999-0"), "ckpt-e0000-s0000002\n");

  EXPECT_EQ(store.list(false).size(), 1u);
  EXPECT_EQ(store.load_latest()->info.global_step, 1);
  store.clean_temporaries();
  EXPECT_EQ(entries(), (std::vector<std::string>{"LATEST", "ckpt-e0000-s0000001"}));
  EXPECT_EQ(store.load_latest()->info.global_step, 1);
}

TEST_F(CheckpointDir, FolderWithoutManifestNeverBlocksAResume) {
  CheckpointStore store(dir_, 3);
  store.save(make_snapshot(0, 2));
  for (const char* name : {"ckpt-e0000-s0000001", "ckpt-e0000-s0000005"}) {
    stdfs::create_directories(path(name));
    gpurun::fs::write_file(path(std::string(name) + "/model.pt"), "partial");
  }
  const auto listed = store.list(false);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[2].problem, "manifest.json missing");
  EXPECT_EQ(listed[2].global_step, 5);  // from the name

  const auto loaded = store.load_latest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->info.global_step, 2);
  EXPECT_TRUE(stdfs::exists(path("ckpt-e0000-s0000005.damaged")));   // newer: set aside
  EXPECT_TRUE(stdfs::exists(path("ckpt-e0000-s0000001")));           // older: left alone
  const gpurun::SaveResult saved = store.save(make_snapshot(0, 3));  // ... to retention
  EXPECT_EQ(saved.removed, std::vector<std::string>{"ckpt-e0000-s0000001"});
  EXPECT_FALSE(stdfs::exists(path("ckpt-e0000-s0000001")));
}

TEST_F(CheckpointDir, ResavingAnExistingCompleteCheckpointKeepsIt) {
  CheckpointStore store(dir_, 3);
  const CheckpointSnapshot first = make_snapshot(0, 4);
  store.save(first);
  const gpurun::SaveResult same = store.save(first);
  EXPECT_EQ(same.path, path("ckpt-e0000-s0000004"));
  EXPECT_EQ(same.bytes, 4096 + 1000 + 6);
  CheckpointSnapshot other = make_snapshot(0, 4);
  other.files[0].second = "different bytes";
  store.save(other);
  EXPECT_EQ(on_disk(*store.load_latest(), first.files), first.files);
  EXPECT_EQ(entries(), (std::vector<std::string>{"LATEST", "ckpt-e0000-s0000004"}));
}

TEST_F(CheckpointDir, ResavingReplacesAFolderThatDoesNotVerify) {
  CheckpointStore store(dir_, 3);
  const CheckpointSnapshot snap = make_snapshot(0, 4);
  store.save(snap);
  truncate_file(path("ckpt-e0000-s0000004/optim.pt"), 10);
  store.save(snap);
  const auto loaded = store.load_latest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(on_disk(*loaded, snap.files), snap.files);
  EXPECT_EQ(entries(), (std::vector<std::string>{"LATEST", "ckpt-e0000-s0000004"}));
}

// Case 7: a writer killed with SIGKILL at random points over many saves. Every resume finds
// the previous or the new complete checkpoint, never a damaged one, and the checkpoint it
// finds never goes backwards.
TEST_F(CheckpointDir, WriterKilledAtRandomPointsAlwaysLeavesALoadableCheckpoint) {
  std::mt19937 rng(7);
  int64_t last_step = -1;
  for (int round = 0; round < 25; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      CheckpointStore store(dir_, 2);
      for (int64_t step = (round + 1) * 1000;; ++step) store.save(make_snapshot(0, step, 2 << 20));
    }
    ::usleep(std::uniform_int_distribution<useconds_t>(0, 60000)(rng));
    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer failed on its own, status " << status;

    CheckpointStore store(dir_, 2);
    const auto loaded = store.load_latest();  // throws on a checkpoint that does not verify
    if (!loaded) {
      EXPECT_EQ(last_step, -1) << "round " << round << ": a complete checkpoint vanished";
      continue;
    }
    EXPECT_GE(loaded->meta.global_step, last_step) << "round " << round;
    EXPECT_EQ(on_disk(*loaded, make_snapshot(0, loaded->meta.global_step, 2 << 20).files),
              make_snapshot(0, loaded->meta.global_step, 2 << 20).files);
    last_step = loaded->meta.global_step;
    store.clean_temporaries();
    for (const auto& name : entries()) {
      EXPECT_EQ(name.find(".damaged"), std::string::npos) << "round " << round << ": " << name;
    }
  }
  EXPECT_GT(last_step, 0) << "no save ever completed";
}

/// Saves `snap` while files may not grow past 64 KiB: a real write failure (EFBIG, as a full
/// disk gives ENOSPC). Returns the IoError's errno, 0 when the save succeeded.
int save_past_a_file_size_limit(CheckpointStore& store, const CheckpointSnapshot& snap) {
  rlimit old_limit{};
  EXPECT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit limit = old_limit;
  limit.rlim_cur = 64 << 10;
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  int err = 0;
  try {
    store.save(snap);
  } catch (const gpurun::IoError& e) {
    err = e.error_number();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  return err;
}

TEST_F(CheckpointDir, FailedSaveThrowsIoErrorAndLeavesThePreviousCheckpoint) {
  CheckpointStore store(dir_, 3);
  store.save(make_snapshot(0, 1));
  EXPECT_EQ(save_past_a_file_size_limit(store, make_snapshot(0, 2, 1 << 20)), EFBIG);
  EXPECT_EQ(entries(), (std::vector<std::string>{"LATEST", "ckpt-e0000-s0000001"}));
  EXPECT_EQ(latest(), "ckpt-e0000-s0000001\n");
  EXPECT_EQ(store.load_latest()->info.global_step, 1);
}

TEST_F(CheckpointDir, SaveUnderARegularFileThrowsIoError) {
  gpurun::fs::make_dirs(root_);
  gpurun::fs::write_file(root_ + "/file", "x");
  CheckpointStore store(root_ + "/file/ckpts", 3);
  try {
    store.save(make_snapshot(0, 1));
    FAIL() << "no exception";
  } catch (const gpurun::IoError& e) {
    EXPECT_EQ(e.error_number(), ENOTDIR);
  }
}

TEST_F(CheckpointDir, BadFileNamesAreRefusedBeforeAnyWrite) {
  CheckpointStore store(dir_, 3);
  CheckpointSnapshot snap = make_snapshot(0, 1);
  snap.files.emplace_back("../escape", "x");
  EXPECT_THROW(store.save(snap), std::invalid_argument);
  snap.files.back().first = "manifest.json";
  EXPECT_THROW(store.save(snap), std::invalid_argument);
  snap.files.back() = snap.files.front();  // a duplicate name
  EXPECT_THROW(store.save(snap), std::invalid_argument);
  EXPECT_FALSE(stdfs::exists(dir_));
  EXPECT_THROW(CheckpointStore(dir_, 0), std::invalid_argument);
}

TEST_F(CheckpointDir, MissingFileAndEmptyDirectory) {
  CheckpointStore store(dir_, 3);
  EXPECT_FALSE(store.load_latest().has_value());  // DIR does not exist yet
  EXPECT_FALSE(store.has_checkpoints());
  stdfs::create_directories(dir_);
  EXPECT_FALSE(store.load_latest().has_value());
  store.save(make_snapshot(0, 1));
  EXPECT_TRUE(store.has_checkpoints());
  try {
    store.load_latest()->file("ema.pt");
    FAIL() << "no exception";
  } catch (const gpurun::ResumeError& e) {
    EXPECT_STREQ(e.what(), "checkpoint ckpt-e0000-s0000001 has no file ema.pt");
  }
}

TEST_F(CheckpointDir, NewerFormatVersionIsNotComplete) {
  CheckpointStore store(dir_, 3);
  store.save(make_snapshot(0, 1));
  const std::string manifest = path("ckpt-e0000-s0000001/manifest.json");
  json m = json::parse(gpurun::fs::read_file(manifest));
  m["format_version"] = gpurun::kShardedFormatVersion + 1;
  gpurun::fs::write_file(manifest, m.dump());
  const auto info = gpurun::CheckpointView::inspect(path("ckpt-e0000-s0000001"), false);
  EXPECT_FALSE(info.complete);
  EXPECT_NE(info.problem.find("format_version 4 is newer"), std::string::npos) << info.problem;
}

TEST_F(CheckpointDir, CkptListPrintsOneJsonObjectOrATable) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 2);
  std::string out;
  ASSERT_EQ(run("list", true, &out), 0);
  const json j = json::parse(out);  // throws on anything after the one object
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["dir"], dir_);
  EXPECT_EQ(j["latest"], names[1]);
  ASSERT_EQ(j["checkpoints"].size(), 2u);
  EXPECT_EQ(j["checkpoints"][1]["name"], names[1]);
  EXPECT_EQ(j["checkpoints"][1]["global_step"], 2);
  EXPECT_EQ(j["checkpoints"][1]["bytes"], 4096 + 1000 + 6);
  EXPECT_EQ(j["checkpoints"][1]["complete"], true);
  EXPECT_EQ(j["checkpoints"][1]["latest"], true);
  EXPECT_EQ(j["checkpoints"][0]["latest"], false);

  ASSERT_EQ(run("list", false, &out), 0);
  EXPECT_NE(out.find(names[1]), std::string::npos) << out;
  EXPECT_NE(out.find("<- LATEST"), std::string::npos) << out;
  EXPECT_EQ(out.find(names[0] + "  "), out.find(names[0]));
  EXPECT_NE(out.find("sizes ok"), std::string::npos) << out;
  EXPECT_NE(out.find("checksums were not read: `gpurun ckpt verify " + dir_ + "` reads them"),
            std::string::npos)
      << out;
}

// Issue 31, item 3: the folders a resume set aside are listed (by list and verify), and what
// list checked is said; a truncated file is DAMAGED by the sizes alone.
TEST_F(CheckpointDir, CkptListShowsTheFoldersSetAsideAndSaysTheChecksumsWereNotRead) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 3);
  truncate_file(path(names[2] + "/model.pt"), 10);
  ASSERT_EQ(store.load_latest(false)->info.name, names[1]);  // sets names[2] aside
  truncate_file(path(names[0] + "/optim.pt"), 10);
  std::string out;
  ASSERT_EQ(run("list", false, &out), 0);
  EXPECT_NE(out.find(names[2] + ".damaged"), std::string::npos) << out;
  EXPECT_NE(out.find("SET ASIDE as damaged by a resume"), std::string::npos) << out;
  EXPECT_NE(out.find("DAMAGED: optim.pt: size 10 != 1000 in manifest"), std::string::npos) << out;
  EXPECT_NE(out.find("checksums were not read"), std::string::npos) << out;
  ASSERT_EQ(run("list", true, &out), 0);
  json j = json::parse(out);
  EXPECT_EQ(j["checked"], "sizes");
  ASSERT_EQ(j["set_aside"].size(), 1u);
  EXPECT_EQ(j["set_aside"][0]["name"], names[2] + ".damaged");
  EXPECT_EQ(j["set_aside"][0]["global_step"], 3);
  EXPECT_EQ(j["checkpoints"].size(), 2u);

  EXPECT_EQ(run("verify", false, &out), 1);
  EXPECT_NE(out.find("aside   " + names[2] + ".damaged"), std::string::npos) << out;
  EXPECT_NE(out.find("1 checkpoint(s) FAILED"), std::string::npos) << out;
  EXPECT_EQ(run("verify", true, &out), 1);
  j = json::parse(out);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["set_aside"][0]["name"], names[2] + ".damaged");
}

// Issue 31, item 3: `gpurun ckpt verify DIR || alert` catches damage to any checkpoint, LATEST
// (the one a resume takes) included, also while an older one verifies.
TEST_F(CheckpointDir, CkptVerifyExitsOneWhenAnyCheckpointFails) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 3);
  std::string out;
  EXPECT_EQ(run("verify", true, &out), 0);
  json j = json::parse(out);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["newest_complete"], names[2]);

  flip_byte(path(names[0] + "/optim.pt"), 5);  // the oldest: the newest still verifies
  EXPECT_EQ(run("verify", false, &out), 1);
  EXPECT_NE(out.find("FAILED  " + names[0] + ": optim.pt: xxh3 mismatch"), std::string::npos)
      << out;
  EXPECT_NE(out.find("newest complete checkpoint: " + names[2]), std::string::npos) << out;
  stdfs::remove_all(path(names[0]));

  flip_byte(path(names[2] + "/trainer.pt"), 0);  // LATEST
  EXPECT_EQ(run("verify", false, &out), 1);
  EXPECT_NE(out.find("FAILED  " + names[2] + ": trainer.pt: xxh3 mismatch"), std::string::npos)
      << out;
  EXPECT_NE(out.find("newest complete checkpoint: " + names[1]), std::string::npos) << out;
  EXPECT_EQ(run("verify", true, &out), 1);
  j = json::parse(out);
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["newest_complete"], names[1]);

  truncate_file(path(names[1] + "/model.pt"), 0);
  EXPECT_EQ(run("verify", true, &out), 1);
  j = json::parse(out);
  EXPECT_EQ(j["ok"], false);
  EXPECT_TRUE(j["newest_complete"].is_null());
  ASSERT_EQ(j["checkpoints"].size(), 2u);
  EXPECT_EQ(j["checkpoints"][0]["problem"], "model.pt: size 0 != 4096 in manifest");
  EXPECT_FALSE(j["checkpoints"][1]["complete"].get<bool>());
  EXPECT_EQ(run("verify", false, &out, root_), 1);  // no checkpoints at all
}

TEST_F(CheckpointDir, CkptInspectShowsTheManifestOfTheRootOrOneFolder) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 2);
  std::string out;
  ASSERT_EQ(run("inspect", true, &out), 0);
  json j = json::parse(out);
  EXPECT_EQ(j["global_step"], 2);
  EXPECT_EQ(j["model_digest"], "fedcba9876543210");
  EXPECT_EQ(j, json::parse(gpurun::fs::read_file(path(names[1] + "/manifest.json"))));

  ASSERT_EQ(run("inspect", true, &out, path(names[0])), 0);
  EXPECT_EQ(json::parse(out)["global_step"], 1);

  ASSERT_EQ(run("inspect", false, &out), 0);
  for (const std::string& want :
       std::vector<std::string>{names[1], "model_digest", "fedcba9876543210", "config_hash",
                                "position_in_epoch", "16", "model.pt", "4096 bytes"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << " not in\n" << out;
  }
  flip_byte(path(names[0] + "/model.pt"), 3);
  EXPECT_EQ(run("inspect", false, &out, path(names[0])), 1);
  EXPECT_NE(out.find("DAMAGED: model.pt: xxh3 mismatch"), std::string::npos) << out;
}

TEST_F(CheckpointDir, CkptErrorsMapToTheirExitCodes) {
  std::string out;
  try {
    run("list", true, &out, root_ + "/missing");
    FAIL() << "no exception";
  } catch (const gpurun::ConfigError& e) {
    EXPECT_EQ(gpurun::exit_code_for(e), gpurun::kExitUsage);
    EXPECT_NE(std::string(e.what()).find("no such directory: " + root_ + "/missing"),
              std::string::npos);
  }
  EXPECT_THROW(run("frobnicate", false, &out), gpurun::ConfigError);
  stdfs::create_directories(dir_);
  EXPECT_THROW(run("inspect", true, &out), gpurun::ResumeError);  // nothing to inspect
}

TEST_F(CheckpointDir, CopyFromAnotherTierKeepsTheManifestAndItsOwnRetention) {
  CheckpointStore local(root_ + "/local", 5);
  CheckpointStore network(dir_, 2);
  for (int step = 1; step <= 3; ++step) {
    const gpurun::SaveResult saved = local.save(make_snapshot(0, step, 1 << 20));
    const gpurun::SaveResult copied = network.copy_from(saved.path);
    EXPECT_EQ(copied.path, path(gpurun::checkpoint_name(0, step)));
    EXPECT_EQ(copied.bytes, saved.bytes);
    EXPECT_EQ(gpurun::fs::read_file(copied.path + "/manifest.json"),
              gpurun::fs::read_file(saved.path + "/manifest.json"));
  }
  EXPECT_EQ(entries(),
            (std::vector<std::string>{"LATEST", "ckpt-e0000-s0000002", "ckpt-e0000-s0000003"}));
  EXPECT_EQ(latest(), "ckpt-e0000-s0000003\n");
  EXPECT_EQ(local.list(false).size(), 3u);
  const auto loaded = network.load_latest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(on_disk(*loaded, make_snapshot(0, 3, 1 << 20).files),
            make_snapshot(0, 3, 1 << 20).files);
}

// The local tier tells when a save writes its files (the network copy holds off then), also
// for a save that fails; a copy offers a pause before each of its 8 MiB chunks.
TEST_F(CheckpointDir, TheWriteHookBracketsEverySaveAndACopyPausesBetweenItsChunks) {
  CheckpointStore local(root_ + "/local", 5);
  std::vector<bool> writing;
  local.set_write_hook([&](bool w) { writing.push_back(w); });
  const gpurun::SaveResult saved = local.save(make_snapshot(0, 1, 20 << 20));
  EXPECT_EQ(writing, (std::vector<bool>{true, false}));
  CheckpointSnapshot bad = make_snapshot(0, 2);
  bad.files.emplace_back("../escape.pt", "x");
  EXPECT_THROW(local.save(bad), std::invalid_argument);
  ASSERT_EQ(writing.size(), 2u) << "refused before anything is written";

  EXPECT_EQ(save_past_a_file_size_limit(local, make_snapshot(0, 3, 1 << 20)), EFBIG);
  EXPECT_EQ(writing, (std::vector<bool>{true, false, true, false})) << "released on failure";

  CheckpointStore network(dir_, 2);
  int pauses = 0;
  network.copy_from(saved.path, [&] { ++pauses; });
  EXPECT_GE(pauses, 3) << "20 MiB of model.pt are at least three 8 MiB chunks";
}

TEST_F(CheckpointDir, CopyOfASourceDamagedSinceItWasWrittenIsRefusedAndLeavesNothing) {
  CheckpointStore local(root_ + "/local", 5);
  CheckpointStore network(dir_, 2);
  network.copy_from(local.save(make_snapshot(0, 1)).path);
  const gpurun::SaveResult second = local.save(make_snapshot(0, 2));
  flip_byte(second.path + "/model.pt", 100);
  try {
    network.copy_from(second.path);
    FAIL() << "a damaged source was copied";
  } catch (const gpurun::ResumeError& e) {
    EXPECT_NE(std::string(e.what()).find("model.pt does not match its manifest"), std::string::npos)
        << e.what();
  }
  // No temporary left, the previous copy and LATEST untouched.
  EXPECT_EQ(entries(), (std::vector<std::string>{"LATEST", "ckpt-e0000-s0000001"}));
  EXPECT_EQ(latest(), "ckpt-e0000-s0000001\n");
  EXPECT_THROW(network.copy_from(root_ + "/local/no-such-folder"), gpurun::ResumeError);
}

TEST_F(CheckpointDir, RetentionSparesTheCheckpointItsGuardKeeps) {
  CheckpointStore store(dir_, 1);
  store.set_retention_guard([](const std::string& name) { return name == "ckpt-e0000-s0000001"; });
  save_steps(store, 3);
  EXPECT_EQ(entries(),
            (std::vector<std::string>{"LATEST", "ckpt-e0000-s0000001", "ckpt-e0000-s0000003"}));
}

TEST(CheckpointName, ParsesWhatCheckpointNameWrites) {
  const auto parsed = gpurun::parse_checkpoint_name(gpurun::checkpoint_name(3, 450));
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->epoch, 3);
  EXPECT_EQ(parsed->global_step, 450);
  const auto aside = gpurun::parse_checkpoint_name("ckpt-e0001-s0000020.damaged.2");
  ASSERT_TRUE(aside.has_value());
  EXPECT_EQ(aside->global_step, 20);
  EXPECT_FALSE(gpurun::parse_checkpoint_name("ckpt-final").has_value());
  EXPECT_FALSE(gpurun::parse_checkpoint_name("LATEST").has_value());

  EXPECT_TRUE(gpurun::is_checkpoint_folder_name("ckpt-e0001-s0000020"));
  EXPECT_TRUE(gpurun::is_checkpoint_folder_name("ckpt-final"));
  EXPECT_FALSE(gpurun::is_checkpoint_folder_name("ckpt-e0001-s0000020.damaged"));
  EXPECT_FALSE(gpurun::is_checkpoint_folder_name("ckpt-e0001-s0000020.damaged.1"));
  EXPECT_FALSE(gpurun::is_checkpoint_folder_name(".tmp-ckpt-e0001-s0000020-123"));
  EXPECT_FALSE(gpurun::is_checkpoint_folder_name("LATEST"));
}

TEST_F(CheckpointDir, ViewListsNewestCompleteAndLatestAsTheStoreWroteThem) {
  const CheckpointView missing(dir_);
  EXPECT_TRUE(missing.list(true).empty());  // DIR does not exist yet
  EXPECT_FALSE(missing.has_checkpoints());
  EXPECT_FALSE(missing.newest_complete().has_value());
  EXPECT_EQ(missing.latest().state, LatestFile::State::kMissing);
  EXPECT_EQ(missing.latest().describe(), "LATEST is missing");

  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 12);  // epochs 0 and 1; the three newest are kept
  const CheckpointView view(dir_);
  const auto listed = view.list(true);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[2].name, names[11]);
  EXPECT_EQ(listed[2].epoch, 1);
  EXPECT_EQ(listed[2].global_step, 12);
  EXPECT_EQ(listed[0].epoch, 1);
  EXPECT_EQ(listed[0].global_step, 10);
  EXPECT_TRUE(view.has_checkpoints());
  ASSERT_NE(CheckpointView::newest_complete(listed), nullptr);
  EXPECT_EQ(CheckpointView::newest_complete(listed)->name, names[11]);
  const auto newest = view.newest_complete();
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->name, names[11]);
  EXPECT_TRUE(newest->complete);
  const LatestFile latest = view.latest();
  EXPECT_EQ(latest.state, LatestFile::State::kPresent);
  EXPECT_EQ(latest.name, names[11]);
  EXPECT_TRUE(latest.names(names[11]));
  EXPECT_FALSE(latest.names(names[10]));
  EXPECT_EQ(latest.describe(), "LATEST names \"" + names[11] + "\"");
  // The store reads through the same view.
  EXPECT_EQ(store.list(true).size(), listed.size());
  EXPECT_EQ(store.view().dir(), dir_);
}

TEST_F(CheckpointDir, ViewSkipsANewerDamagedCheckpointAndLeavesItInPlace) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 3);
  flip_byte(path(names[2] + "/model.pt"), 10);  // sizes match: only the checksum sees it
  truncate_file(path(names[1] + "/optim.pt"), 3);
  const auto newest = CheckpointView(dir_).newest_complete();
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->name, names[0]);
  EXPECT_TRUE(stdfs::exists(path(names[2] + "/model.pt")));  // read-only: nothing renamed
  EXPECT_TRUE(stdfs::exists(path(names[1] + "/optim.pt")));
  EXPECT_EQ(entries(), (std::vector<std::string>{"LATEST", names[0], names[1], names[2]}));
}

TEST_F(CheckpointDir, IsCheckpointFolderTellsAFolderFromARoot) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 1);
  EXPECT_TRUE(CheckpointView::is_checkpoint_folder(path(names[0])));
  EXPECT_TRUE(CheckpointView::is_checkpoint_folder(path(names[0]) + "/"));
  EXPECT_TRUE(CheckpointView::is_checkpoint_folder(path(names[0] + ".damaged")));
  EXPECT_FALSE(CheckpointView::is_checkpoint_folder(dir_));
  EXPECT_FALSE(CheckpointView::is_checkpoint_folder(dir_ + "/"));
  // Renamed by a person: its manifest says what it is.
  stdfs::rename(path(names[0]), root_ + "/best");
  EXPECT_TRUE(CheckpointView::is_checkpoint_folder(root_ + "/best"));
}

// Issue 16, defect 4: a file that cannot be read as a file is damage like any other, for the
// view (every checkpoint reported) and for a resume (set aside, the previous one loaded).
TEST_F(CheckpointDir, AFileReplacedByADirectoryDamagesOnlyItsCheckpoint) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 3);
  stdfs::remove(path(names[2] + "/model.pt"));
  stdfs::create_directories(path(names[2] + "/model.pt"));
  stdfs::remove(path(names[1] + "/manifest.json"));
  stdfs::create_directories(path(names[1] + "/manifest.json"));
  for (const bool verify : {false, true}) {
    const auto listed = CheckpointView(dir_).list(verify);
    ASSERT_EQ(listed.size(), 3u);
    EXPECT_TRUE(listed[0].complete) << listed[0].problem;
    EXPECT_EQ(listed[1].problem, "manifest.json: not a regular file");
    EXPECT_EQ(listed[2].problem, "model.pt: not a regular file");
  }
  EXPECT_EQ(CheckpointView(dir_).newest_complete()->name, names[0]);
  EXPECT_THROW(CheckpointStore::load(path(names[2])), gpurun::ResumeError);

  const auto loaded = store.load_latest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->info.name, names[0]);
  EXPECT_TRUE(stdfs::is_directory(path(names[2] + ".damaged/model.pt")));
}

TEST_F(CheckpointDir, AFifoWhereAFileBelongsIsDamageAndNeverBlocks) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 2);
  stdfs::remove(path(names[1] + "/trainer.pt"));
  ASSERT_EQ(::mkfifo(path(names[1] + "/trainer.pt").c_str(), 0600), 0);
  const auto listed = CheckpointView(dir_).list(true);  // opening it for reading would block
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[1].problem, "trainer.pt: not a regular file");
  EXPECT_EQ(store.load_latest()->info.name, names[0]);
}

TEST_F(CheckpointDir, UnreadableFileIsReportedByTheViewAndThrownForAResume) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads a file of mode 000";
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 2);
  ASSERT_EQ(::chmod(path(names[1] + "/model.pt").c_str(), 0), 0);
  const auto listed = CheckpointView(dir_).list(true);
  EXPECT_EQ(listed[1].problem.rfind("model.pt: cannot be read (", 0), 0u) << listed[1].problem;
  EXPECT_THROW(CheckpointView(dir_, gpurun::ReadErrors::kThrow).list(true), gpurun::IoError);
  // The storage, not the checkpoint, failed: a resume neither sets it aside nor falls back.
  EXPECT_THROW(store.load_latest(), gpurun::IoError);
  EXPECT_TRUE(stdfs::exists(path(names[1])));
}

// Issue 16, defect 11: LATEST's bytes never reach a terminal raw.
TEST_F(CheckpointDir, LatestIsDescribedEscapedMissingEmptyOrUnreadable) {
  stdfs::create_directories(dir_);
  const std::string garbage("ckpt-\0\xff\n\x1b[2J", 12);
  gpurun::fs::write_file(path("LATEST"), garbage + "\n");
  LatestFile latest = CheckpointView(dir_).latest();
  EXPECT_EQ(latest.state, LatestFile::State::kPresent);
  EXPECT_EQ(latest.name, garbage);  // as it is, for comparisons
  EXPECT_EQ(latest.describe(), R"(LATEST names "ckpt-\x00\xff\n\x1b[2J")");

  gpurun::fs::write_file(path("LATEST"), " \n");
  EXPECT_EQ(CheckpointView(dir_).latest().describe(), "LATEST is empty");
  stdfs::remove(path("LATEST"));
  EXPECT_EQ(CheckpointView(dir_).latest().describe(), "LATEST is missing");
  stdfs::create_directories(path("LATEST"));
  latest = CheckpointView(dir_).latest();
  EXPECT_EQ(latest.state, LatestFile::State::kUnreadable);
  EXPECT_EQ(latest.describe().rfind("LATEST cannot be read (read ", 0), 0u) << latest.describe();
}

TEST_F(CheckpointDir, AResumeCorrectsAMissingLatest) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 2);
  stdfs::remove(path("LATEST"));
  EXPECT_EQ(store.load_latest()->info.name, names[1]);
  EXPECT_EQ(latest(), names[1] + "\n");
}

// save() in its three steps: hashing refuses bad names before any write (above), writing keeps
// an existing complete folder (above), and retention spares what is newer than the newest
// complete checkpoint, which may be a save in progress under another name.
TEST_F(CheckpointDir, RetentionSparesAnIncompleteFolderNewerThanTheNewestComplete) {
  CheckpointStore store(dir_, 2);
  save_steps(store, 2);
  stdfs::create_directories(path("ckpt-e0000-s0000009"));
  stdfs::create_directories(path("ckpt-e0000-s0000000"));
  const gpurun::SaveResult saved = store.save(make_snapshot(0, 3));
  EXPECT_EQ(saved.removed,
            (std::vector<std::string>{"ckpt-e0000-s0000001", "ckpt-e0000-s0000000"}));
  EXPECT_EQ(entries(), (std::vector<std::string>{"LATEST", "ckpt-e0000-s0000002",
                                                 "ckpt-e0000-s0000003", "ckpt-e0000-s0000009"}));
  EXPECT_EQ(saved.bytes, 4096 + 1000 + 6);
}

TEST_F(CheckpointDir, CkptVerifyAndInspectGoOnPastAnUnreadableFile) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 2);
  stdfs::remove(path(names[1] + "/model.pt"));
  stdfs::create_directories(path(names[1] + "/model.pt"));
  std::string out;
  EXPECT_EQ(run("verify", false, &out), 1);
  EXPECT_NE(out.find("FAILED  " + names[1] + ": model.pt: not a regular file"), std::string::npos)
      << out;
  EXPECT_NE(out.find("ok      " + names[0]), std::string::npos) << out;
  ASSERT_EQ(run("inspect", true, &out), 0);
  EXPECT_EQ(json::parse(out)["global_step"], 1);
  EXPECT_EQ(run("inspect", true, &out, path(names[1])), 1);  // its manifest, not verifying
  EXPECT_EQ(json::parse(out)["global_step"], 2);
}

TEST_F(CheckpointDir, CkptListEscapesAGarbageLatest) {
  CheckpointStore store(dir_, 3);
  const auto names = save_steps(store, 1);
  gpurun::fs::write_file(path("LATEST"), std::string("ckpt-\0\xff\x1b[2J\n", 12));
  std::string out;
  ASSERT_EQ(run("list", false, &out), 0);
  EXPECT_NE(out.find(R"(LATEST names "ckpt-\x00\xff\x1b[2J", which is not here)"),
            std::string::npos)
      << out;
  for (const char raw : {'\0', '\xff', '\x1b'}) EXPECT_EQ(out.find(raw), std::string::npos);
  ASSERT_EQ(run("list", true, &out), 0);
  const json j = json::parse(out);  // not UTF-8 on disk, valid JSON out
  EXPECT_EQ(j["checkpoints"][0]["latest"], false);
  EXPECT_EQ(j["latest"].get<std::string>().substr(0, 6), std::string("ckpt-\0", 6));

  stdfs::remove(path("LATEST"));
  ASSERT_EQ(run("list", false, &out), 0);
  EXPECT_NE(out.find("LATEST is missing"), std::string::npos) << out;
  EXPECT_EQ(out.find("LATEST names"), std::string::npos) << out;
}

}  // namespace

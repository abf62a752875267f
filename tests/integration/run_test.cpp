// The gpurun command line end to end: config errors, --set, directory rules, damaged
// checkpoints, retention, --json outputs, and model.pt read by Python's torch.load.
#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/format/train_state.h"
#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> checkpoint_names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Config, TypoNamesTheKeyAndSuggestsTheRightOne) {
  TempDir dir;
  const std::string config = write_config(dir, "model: {name: mlp}\ntrain:\n  epoch: 3\n");
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "run.yaml:3")) << r.err;
  EXPECT_TRUE(contains(r.err, "train.epoch")) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean train.epochs?")) << r.err;
  EXPECT_FALSE(fs::exists(dir / "ckpt")) << "a config error must not create the directory";
}

TEST(Config, WrongTypeAndNegativeLearningRateNameKeyAndValue) {
  TempDir dir;
  Result wrong_type =
      run_gpurun({write_config(dir, "train: {batch_size: abc}\n"), "--ckpt", dir / "c1"});
  EXPECT_EQ(wrong_type.exit_code, 2);
  EXPECT_TRUE(contains(wrong_type.err, "train.batch_size")) << wrong_type.err;
  EXPECT_TRUE(contains(wrong_type.err, "abc")) << wrong_type.err;

  Result negative =
      run_gpurun({write_config(dir, "optim:\n  lr: -0.1\n", "neg.yaml"), "--ckpt", dir / "c2"});
  EXPECT_EQ(negative.exit_code, 2);
  EXPECT_TRUE(contains(negative.err, "neg.yaml:2")) << negative.err;
  EXPECT_TRUE(contains(negative.err, "optim.lr")) << negative.err;
  EXPECT_TRUE(contains(negative.err, "-0.1")) << negative.err;

  Result bad_set = run_gpurun(
      {write_config(dir, "", "empty.yaml"), "--ckpt", dir / "c3", "--set", "train.epochs=zero"});
  EXPECT_EQ(bad_set.exit_code, 2);
  EXPECT_TRUE(contains(bad_set.err, "train.epochs")) << bad_set.err;
}

TEST(Config, SetTwiceTheLastWins) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(60, 30, 1));
  Result r = run_gpurun(
      {config, "--ckpt", dir / "ckpt", "--set", "train.epochs=5", "--set", "train.epochs=2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json manifest = inspect(dir / "ckpt");
  EXPECT_EQ(manifest["config"]["train"]["epochs"], 2);
  EXPECT_EQ(manifest["epoch"], 2);
}

TEST(Warnings, BatchLargerThanTheTrainingSetIsOneStepAnEpoch) {
  TempDir dir;
  Result r = run_gpurun({write_config(dir, small_config(60, 100, 2)), "--ckpt", dir / "ckpt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "train.batch_size 100 is larger than the training set (60 samples): "
                       "every epoch is a single optimizer step of 60 samples"))
      << r.err;
  EXPECT_FALSE(contains(r.err, "is above the memory of")) << r.err;
  EXPECT_EQ(inspect(dir / "ckpt")["global_step"], 2);  // 2 epochs, 1 step each

  Result fits =
      run_gpurun({write_config(dir, small_config(60, 60, 1), "fits.yaml"), "--ckpt", dir / "fits"});
  ASSERT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_FALSE(contains(fits.err, "larger than the training set")) << fits.err;
}

TEST(Warnings, MemoryLimitAboveTheMachinesMemory) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(60, 30, 1));
  // 1 PiB: more than any machine these tests run on has (the meter reads the physical RAM, or
  // the cgroup limit when smaller).
  Result r =
      run_gpurun({config, "--ckpt", dir / "ckpt", "--device", "cpu", "--memory-limit", "1024TiB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "--memory-limit 1.00 PiB is above the memory of cpu (")) << r.err;
  EXPECT_TRUE(contains(r.err, "the plan counts on memory the machine does not have")) << r.err;
  EXPECT_FALSE(contains(r.err, "larger than the training set")) << r.err;

  // memory.capacity is the same limit written in run.yaml; `plan` opens the same session.
  Result from_config =
      run_gpurun({"plan", config, "--device", "cpu", "--set", "memory.capacity=1024TiB"});
  ASSERT_EQ(from_config.exit_code, 0) << from_config.err;
  EXPECT_TRUE(contains(from_config.err, "memory.capacity 1024TiB is above the memory of cpu ("))
      << from_config.err;

  Result fits = run_gpurun({"plan", config, "--device", "cpu", "--memory-limit", "256MiB"});
  ASSERT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_FALSE(contains(fits.err, "is above the memory of")) << fits.err;
}

TEST(Directory, ExistingCheckpointsNeedResumeAndChangedKeysAreRefused) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(60, 30, 1));
  ASSERT_EQ(run_gpurun({config, "--ckpt", dir / "ckpt"}).exit_code, 0);

  Result again = run_gpurun({config, "--ckpt", dir / "ckpt"});
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_TRUE(contains(again.err, "ckpt-e0001-s0000002")) << again.err;
  EXPECT_TRUE(contains(again.err, "--resume")) << again.err;

  Result changed =
      run_gpurun({config, "--ckpt", dir / "ckpt", "--resume", "--set", "optim.lr=0.5"});
  EXPECT_EQ(changed.exit_code, 3);
  EXPECT_TRUE(contains(changed.err, "optim.lr")) << changed.err;

  // Growing train.epochs extends the run.
  Result extended =
      run_gpurun({config, "--ckpt", dir / "ckpt", "--resume", "--set", "train.epochs=2"});
  EXPECT_EQ(extended.exit_code, 0) << extended.err;
  EXPECT_EQ(inspect(dir / "ckpt")["global_step"], 4);
}

TEST(Damage, NewestDamagedFallsBackToThePreviousAndAllDamagedExits3) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(60, 30, 3));
  ASSERT_EQ(
      run_gpurun({config, "--ckpt", dir / "ckpt", "--set", "checkpoint.keep_last=3"}).exit_code, 0);
  auto names = checkpoint_names(dir / "ckpt");
  ASSERT_EQ(names.size(), 3u);
  const std::string newest = dir / ("ckpt/" + names[2]);
  const std::string middle = dir / ("ckpt/" + names[1]);
  const std::string oldest = dir / ("ckpt/" + names[0]);
  fs::resize_file(newest + "/model.pt", fs::file_size(newest + "/model.pt") / 2);  // truncated
  flip_byte(middle + "/optim.pt", 40);  // found as the resume reads it
  Result verify = run_gpurun({"ckpt", "verify", dir / "ckpt", "--json"});
  EXPECT_EQ(verify.exit_code, 1) << verify.out;  // the oldest verifies; two do not

  // epochs=4 so that the resumed run has work to do after falling back to epoch 1.
  Result resumed = run_gpurun({config, "--ckpt", dir / "ckpt", "--resume", "--set",
                               "train.epochs=3", "--set", "checkpoint.keep_last=3"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, names[2])) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, names[1])) << resumed.err;
  EXPECT_TRUE(fs::exists(newest + ".damaged"));
  EXPECT_TRUE(fs::exists(middle + ".damaged"));
  EXPECT_EQ(events(dir / "ckpt", "resume").back()["global_step"], 2);
  EXPECT_EQ(inspect(dir / "ckpt")["global_step"], 6);

  // Now damage every complete checkpoint: resume must refuse with exit 3 naming them.
  for (const auto& name : checkpoint_names(dir / "ckpt"))
    if (name.find(".damaged") == std::string::npos)
      fs::resize_file(dir / ("ckpt/" + name + "/trainer.pt"), 3);
  Result none = run_gpurun({config, "--ckpt", dir / "ckpt", "--resume"});
  EXPECT_EQ(none.exit_code, 3) << none.err;
  EXPECT_TRUE(contains(none.err, "trainer.pt")) << none.err;
  Result verify_none = run_gpurun({"ckpt", "verify", dir / "ckpt"});
  EXPECT_EQ(verify_none.exit_code, 1) << verify_none.out;
  // The same line again (a restart loop) must not start over and lose the run: every
  // checkpoint is now set aside, and resume still refuses, naming them.
  Result again = run_gpurun({config, "--ckpt", dir / "ckpt", "--resume"});
  EXPECT_EQ(again.exit_code, 3) << again.err;
  EXPECT_TRUE(contains(again.err, "set aside as damaged")) << again.err;
  EXPECT_TRUE(contains(again.err, names[0])) << again.err;
  (void)oldest;
}

TEST(Retention, KeepLastTwoAfterFiveEpochsNeverLeavesNoCompleteCheckpoint) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(120, 30, 5));
  const std::string ckpt = dir / "ckpt";
  std::atomic<bool> done{false};
  std::atomic<int> seen_complete{0}, lost_all{0};
  // Watches the directory while the run saves: once a complete checkpoint exists, some
  // complete checkpoint must exist at every later moment.
  std::thread watcher([&] {
    while (!done) {
      int complete = 0;
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(ckpt, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("ckpt-", 0) == 0 && fs::exists(e.path() / "manifest.json", ec)) ++complete;
      }
      if (complete > 0)
        seen_complete = 1;
      else if (seen_complete)
        ++lost_all;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  Result r = run_gpurun({config, "--ckpt", ckpt, "--set", "checkpoint.keep_last=2"});
  done = true;
  watcher.join();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(lost_all, 0);
  EXPECT_EQ(checkpoint_names(ckpt),
            (std::vector<std::string>{"ckpt-e0004-s0000016", "ckpt-e0005-s0000020"}));
  EXPECT_EQ(slurp(ckpt + "/LATEST"), "ckpt-e0005-s0000020\n");
  EXPECT_EQ(events(ckpt, "checkpoint").size(), 5u);
}

// A keep_last lowered on --resume takes effect at the resume, before any save: a disk the old
// keep_last filled would otherwise fail every save (the first one would have made the room).
TEST(Retention, AKeepLastLoweredOnResumeAppliesAtOnce) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(120, 30, 3));
  const std::string ckpt = dir / "ckpt";
  ASSERT_EQ(run_gpurun({config, "--ckpt", ckpt, "--set", "checkpoint.keep_last=5"}).exit_code, 0);
  ASSERT_EQ(checkpoint_names(ckpt).size(), 3u);
  // The finished run extended by one epoch, killed after its first step, before any save.
  Result r = run_gpurun({config, "--ckpt", ckpt, "--resume", "--set", "checkpoint.keep_last=1",
                         "--set", "train.epochs=4"},
                        {{"GPURUN_FAULT", "sigkill:after_step:*"}});
  ASSERT_EQ(r.signal, SIGKILL) << "exit " << r.exit_code << "\n" << r.err;
  EXPECT_TRUE(contains(r.err, "retention: removed")) << r.err;
  EXPECT_EQ(checkpoint_names(ckpt), (std::vector<std::string>{"ckpt-e0003-s0000012"}));
}

// The async writer builds a checkpoint's files from a host copy taken at the save step, while
// training goes on: every save of an async run holds the weights of its own step, as the
// same run's synchronous saves do.
TEST(AsyncSave, EverySaveStepHasTheDigestOfTheSynchronousSave) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(240, 20, 2));
  std::map<std::string, std::map<int64_t, std::string>> digests;  // mode -> step -> digest
  for (const std::string mode : {"true", "false"}) {
    const std::string ckpt = dir / ("ckpt-" + mode);
    Result r = run_gpurun({config, "--ckpt", ckpt, "--set", "checkpoint.async=" + mode, "--set",
                           "checkpoint.every_steps=5", "--set", "checkpoint.keep_last=100"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const auto& e : events(ckpt, "checkpoint")) {
      const std::string path = e["path"].get<std::string>();
      const auto manifest = nlohmann::json::parse(slurp(path + "/manifest.json"));
      digests[mode][e["global_step"].get<int64_t>()] = manifest["model_digest"].get<std::string>();
      EXPECT_TRUE(e.contains("build_seconds")) << e.dump();
    }
  }
  ASSERT_GE(digests["true"].size(), 5u);  // every 5 steps and at both epoch ends of 12 steps
  EXPECT_EQ(digests["true"], digests["false"]);
  std::set<std::string> distinct;
  for (const auto& [step, digest] : digests["true"]) distinct.insert(digest);
  EXPECT_EQ(distinct.size(), digests["true"].size()) << "two saves hold the same weights";
}

TEST(Json, EveryJsonOutputIsExactlyOneObject) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(60, 30, 1));
  ASSERT_EQ(run_gpurun({config, "--ckpt", dir / "ckpt"}).exit_code, 0);
  const std::string one = dir / "ckpt/" + checkpoint_names(dir / "ckpt").back();
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"ckpt", "list", dir / "ckpt", "--json"},
                                             {"ckpt", "verify", dir / "ckpt", "--json"},
                                             {"ckpt", "inspect", dir / "ckpt", "--json"},
                                             {"ckpt", "inspect", one, "--json"},
                                             {"status", dir / "ckpt", "--json"}}) {
    Result r = run_gpurun(args);
    EXPECT_EQ(r.exit_code, 0) << args[0] << " " << args[1] << ": " << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_TRUE(!j.is_discarded() && j.is_object()) << args[0] << " " << args[1] << ": " << r.out;
  }
  nlohmann::json manifest = inspect(dir / "ckpt");
  for (const char* key : {"format_version", "gpurun_version", "torch_version", "config_hash",
                          "config", "epoch", "global_step", "position_in_epoch", "world_size",
                          "plan", "files", "model_digest", "threads", "cpu_capability"})
    EXPECT_TRUE(manifest.contains(key)) << key;
  nlohmann::json status = nlohmann::json::parse(run_gpurun({"status", dir / "ckpt", "--json"}).out);
  EXPECT_EQ(status["state"], "finished");
}

TEST(Interop, ModelPtLoadsInPythonAsAPlainDictOfTheSameTensors) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << ": the Python with torch (install-deps.sh)";
  TempDir dir;
  const std::string config = write_config(dir, small_config(60, 30, 1));
  ASSERT_EQ(run_gpurun({config, "--ckpt", dir / "ckpt", "--set", "model.name=cnn", "--set",
                        "model.batch_norm=true", "--set", "model.channels=[4]"})
                .exit_code,
            0);
  const std::string model_pt = dir / "ckpt/" + checkpoint_names(dir / "ckpt").back() + "/model.pt";
  // Python loads it as a plain dict of tensors and writes it back with torch.save; the tensors
  // read back here must equal gpurun's bit for bit.
  const std::string script =
      "import sys, torch\n"
      "d = torch.load(sys.argv[1])\n"
      "assert type(d) is dict, type(d)\n"
      "assert all(isinstance(v, torch.Tensor) for v in d.values())\n"
      "print(len(d), ','.join(d.keys()))\n"
      "torch.save({k: v.clone() for k, v in d.items()}, sys.argv[2])\n";
  Result py = run_program({kPython, "-c", script, model_pt, dir / "back.pt"});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  EXPECT_TRUE(contains(py.out, "num_batches_tracked")) << py.out;
  NamedTensors ours = unpickle_tensors(slurp(model_pt), "model.pt");
  NamedTensors theirs = unpickle_tensors(slurp(dir / "back.pt"), "back.pt");
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(ours[i].first, theirs[i].first);
    EXPECT_TRUE(ours[i].second.equal(theirs[i].second)) << ours[i].first;
  }
}

}  // namespace
}  // namespace gpurun::test

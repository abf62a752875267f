// TorchScript models and `gpurun export` (issue 6) with the real binary, checked from Debian's
// Python (the torch this build uses, GPURUN_PYTHON): a module scripted in Python trains, resumes
// exactly, and comes back to Python trained; a state_dict export loads with torch.load.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;

/// Writes a scripted Fashion-MNIST classifier with BatchNorm (buffers) and dropout (RNG) to
/// `path`, from Python, as a user would (torch.jit.script reads the class's source, so the script
/// is a file).
void script_model(const std::string& path) {
  const std::string script = path + ".py";
  std::ofstream(script)
      << "import sys, torch\n"
         "torch.manual_seed(0)\n"
         "class Net(torch.nn.Module):\n"
         "    def __init__(self):\n"
         "        super().__init__()\n"
         "        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 64),\n"
         "                                        torch.nn.BatchNorm1d(64), torch.nn.ReLU(),\n"
         "                                        torch.nn.Dropout(0.1))\n"
         "        self.head = torch.nn.Linear(64, 10)\n"
         "    def forward(self, x):\n"
         "        return self.head(self.body(x))\n"
         "torch.jit.script(Net()).save(sys.argv[1])\n";
  Result py = run_program({kPython, script, path});
  ASSERT_EQ(py.exit_code, 0) << py.err;
}

/// Fashion-MNIST, `train` samples, batches of `batch`, `model.torchscript: net.pt`.
std::string torchscript_config(int train, int batch, int epochs) {
  return "model: {torchscript: net.pt}\n"
         "data: {name: idx, train_samples: " +
         std::to_string(train) +
         ", eval_samples: 200}\n"
         "optim: {name: sgd, lr: 0.05, momentum: 0.9}\n"
         "train: {epochs: " +
         std::to_string(epochs) + ", batch_size: " + std::to_string(batch) +
         ", eval_batch_size: 200, seed: 7, threads: 1}\n"
         "checkpoint: {every_steps: 5, async: false}\n"
         "log: {every_steps: 5}\n";
}

/// The newest complete checkpoint folder of `ckpt`.
std::string latest(const std::string& ckpt) {
  std::string name = slurp(ckpt + "/LATEST");
  name.erase(name.find_last_not_of("\n ") + 1);
  return ckpt + "/" + name;
}

TEST(TorchScript, TrainsWithFallingLossAndResumesAfterSigkillToTheSameDigest) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << ": the Python with torch (install-deps.sh)";
  TempDir dir;
  script_model(dir / "net.pt");
  const std::string config = write_config(dir, torchscript_config(1200, 40, 2));  // 60 steps

  Result full = run_gpurun({config, "--ckpt", dir / "full"});
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const auto steps = events(dir / "full", "step");
  ASSERT_EQ(steps.size(), 12u);
  const double first = steps.front()["loss"].get<double>(),
               last = steps.back()["loss"].get<double>();
  EXPECT_LT(last, 0.75 * first) << "loss " << first << " -> " << last;
  const auto epochs = events(dir / "full", "epoch");
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_GT(epochs.back()["eval_accuracy"].get<double>(), 0.6);
  const nlohmann::json manifest = inspect(dir / "full");
  EXPECT_EQ(manifest["config"]["model"]["name"], "torchscript");
  EXPECT_EQ(manifest["extra"]["model_source"]["kind"], "torchscript");
  EXPECT_EQ(manifest["extra"]["model_source"]["path"], dir / "net.pt");
  const std::string expected = manifest.value("model_digest", "");
  ASSERT_EQ(expected.size(), 16u);
  std::cout << "TorchScript loss " << first << " -> " << last << ", eval accuracy "
            << epochs.back()["eval_accuracy"] << "\n";

  const std::vector<std::string> args{config, "--ckpt", dir / "ckpt", "--resume"};
  Result killed = run_gpurun(args, {{"GPURUN_FAULT", "sigkill:after_step:23"}});
  ASSERT_EQ(killed.signal, SIGKILL) << "exit " << killed.exit_code << "\n" << killed.err;
  Result resumed = run_gpurun(args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto resumes = events(dir / "ckpt", "resume");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_EQ(resumes[0]["global_step"], 20);
  EXPECT_EQ(inspect(dir / "ckpt").value("model_digest", ""), expected);
}

TEST(Export, TorchScriptCheckpointLoadsInPythonAsTheTrainedModule) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << ": the Python with torch (install-deps.sh)";
  TempDir dir;
  script_model(dir / "net.pt");
  const std::string config = write_config(dir, torchscript_config(300, 30, 1));
  ASSERT_EQ(run_gpurun({config, "--ckpt", dir / "ckpt"}).exit_code, 0);
  const std::string checkpoint = latest(dir / "ckpt");

  Result r = run_gpurun({"export", dir / "ckpt", "--to", dir / "trained.pt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "as a TorchScript module (torch.jit.load)")) << r.out;
  EXPECT_TRUE(contains(r.out, "global step 10")) << r.out;
  // The module's state_dict is the checkpoint's model.pt, name for name and bit for bit; the
  // weights are not the initial ones; and the module runs.
  const char* check =
      "import sys, torch\n"
      "m = torch.jit.load(sys.argv[1])\n"
      "saved = torch.load(sys.argv[2])\n"
      "initial = torch.jit.load(sys.argv[3]).state_dict()\n"
      "sd = m.state_dict()\n"
      "assert list(sd) == list(saved), (list(sd), list(saved))\n"
      "for k, v in sd.items(): assert torch.equal(v, saved[k]), k\n"
      "assert not torch.equal(sd['head.weight'], initial['head.weight'])\n"
      "assert sd['body.2.num_batches_tracked'].item() == 10, sd['body.2.num_batches_tracked']\n"
      "m.eval()\n"
      "assert m(torch.zeros(2, 1, 28, 28)).shape == (2, 10)\n"
      "print('OK', len(sd), 'tensors')\n";
  Result py = run_program(
      {kPython, "-c", check, dir / "trained.pt", checkpoint + "/model.pt", dir / "net.pt"});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  EXPECT_TRUE(contains(py.out, "OK 9 tensors")) << py.out;

  // The module file holds the code: without it there is nothing to export it into.
  fs::rename(dir / "net.pt", dir / "moved.pt");
  Result gone = run_gpurun({"export", dir / "ckpt", "--to", dir / "again.pt"});
  EXPECT_EQ(gone.exit_code, 2);
  EXPECT_TRUE(contains(
      gone.err, "was trained from the TorchScript module " + (dir / "net.pt") + ", which is gone"))
      << gone.err;
}

TEST(Export, StateDictOfTheNewestCompleteCheckpointLoadsInPython) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << ": the Python with torch (install-deps.sh)";
  TempDir dir;
  const std::string config = write_config(dir, small_config(300, 30, 1));  // 10 steps
  ASSERT_EQ(
      run_gpurun({config, "--ckpt", dir / "ckpt", "--set", "checkpoint.every_steps=4"}).exit_code,
      0);
  // Damage the newest checkpoint (step 10): export refuses it, naming the previous one, which
  // --step exports, and leaves the damaged one where it is (a run may be writing there).
  const std::string newest = latest(dir / "ckpt");
  ASSERT_TRUE(contains(newest, "s0000010"));
  {
    std::fstream f(newest + "/model.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  Result r = run_gpurun({"export", dir / "ckpt", "--to", dir / "weights.pt"});
  ASSERT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "ckpt-e0001-s0000010 (global step 10) does not verify")) << r.err;
  EXPECT_TRUE(contains(r.err, "ckpt-e0000-s0000008 (global step 8): export it with --step 8"))
      << r.err;
  EXPECT_FALSE(fs::exists(dir / "weights.pt"));
  r = run_gpurun({"export", dir / "ckpt", "--to", dir / "weights.pt", "--step", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "ckpt-e0000-s0000008 (global step 8")) << r.out;
  EXPECT_TRUE(contains(r.out, "as a state_dict (torch.load)")) << r.out;
  EXPECT_TRUE(fs::exists(newest)) << "export renamed the damaged checkpoint";
  const char* check =
      "import sys, torch\n"
      "d = torch.load(sys.argv[1])\n"
      "ref = torch.load(sys.argv[2])\n"
      "assert type(d) is dict and list(d) == list(ref), (type(d), list(d))\n"
      "for k, v in d.items(): assert torch.equal(v, ref[k]), k\n"
      "print('OK', ','.join(d))\n";
  Result py = run_program(
      {kPython, "-c", check, dir / "weights.pt", dir / "ckpt/ckpt-e0000-s0000008/model.pt"});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  EXPECT_TRUE(contains(py.out, "OK block0.1.weight,block0.1.bias,head.0.weight,head.0.bias"))
      << py.out;

  // One ckpt-* folder can be named directly; a damaged one is refused.
  EXPECT_EQ(
      run_gpurun({"export", dir / "ckpt/ckpt-e0000-s0000008", "--to", dir / "w8.pt"}).exit_code, 0);
  EXPECT_EQ(run_gpurun({"export", newest, "--to", dir / "w10.pt"}).exit_code, 3);
  EXPECT_FALSE(fs::exists(dir / "w10.pt"));
  // Usage errors exit 2, a directory without checkpoints 3.
  EXPECT_EQ(run_gpurun({"export", dir / "missing", "--to", dir / "x.pt"}).exit_code, 2);
  EXPECT_EQ(run_gpurun({"export", dir / "ckpt", "--to", dir / "no/such/dir/x.pt"}).exit_code, 2);
  EXPECT_EQ(run_gpurun({"export", dir / "ckpt"}).exit_code, 2);
  fs::create_directories(dir / "empty");
  Result none = run_gpurun({"export", dir / "empty", "--to", dir / "x.pt"});
  EXPECT_EQ(none.exit_code, 3);
  EXPECT_TRUE(contains(none.err, "no checkpoint in")) << none.err;
}

}  // namespace
}  // namespace gpurun::test

// Fine-tuning through the real binary (issue 12): model.freeze, model.init_from from a dict
// saved by Python, and LoRA on the character-level gpt: fewer trainable parameters and
// optimizer state, a lower loss from a gpt trained earlier, a merged export that Python loads
// as the base architecture with gpurun's logits, and exact resume after SIGKILL.
#include <signal.h>
#include <unistd.h>

#include <ATen/ops/arange.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "builtin.h"
#include "checkpoint/format/pickle.h"
#include "gpurun/config.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "integration/harness.h"
#include "model/fine_tune.h"
#include "train/init_weights.h"
#include "util/fs.h"

namespace gpurun::test {
namespace {

namespace stdfs = std::filesystem;

std::string newest(const std::string& ckpt) {
  return ckpt + "/" + trimmed(slurp(ckpt + "/LATEST"));
}

int64_t file_size(const std::string& path) {
  std::error_code ec;
  const auto size = stdfs::file_size(path, ec);
  return ec ? -1 : static_cast<int64_t>(size);
}

/// The line "parameters: T trainable of N" of a run's log: {T, N}.
std::pair<int64_t, int64_t> parameter_counts(const std::string& log) {
  const size_t at = log.find("parameters: ");
  if (at == std::string::npos) return {-1, -1};
  std::istringstream in(log.substr(at + 12));
  int64_t trainable = -1, total = -1;
  std::string word1, word2;
  in >> trainable >> word1 >> word2 >> total;
  return {trainable, total};
}

TEST(Freeze, FrozenParametersGetNoOptimizerStateAndThePlanCountsOnlyTheTrainable) {
  TempDir dir;
  std::string yaml = small_config(240, 40, 1);
  yaml.replace(yaml.find("hidden: [64]"), 12, "hidden: [256, 64]");
  const std::string config = write_config(dir, yaml);
  Result all = run_gpurun(with_sets({config, "--ckpt", dir / "all"}, {"optim.name=adam"}));
  ASSERT_EQ(all.exit_code, 0) << all.err;
  Result frozen = run_gpurun(with_sets({config, "--ckpt", dir / "frozen"},
                                       {"optim.name=adam", "model.freeze=[block0.*]"}));
  ASSERT_EQ(frozen.exit_code, 0) << frozen.err;
  // block0's Linear: 784 x 256 + 256 floats, each with Adam's exp_avg and exp_avg_sq.
  const int64_t block0 = (784 * 256 + 256) * 4;
  const int64_t optim_drop = file_size(newest(dir / "all") + "/optim.pt") -
                             file_size(newest(dir / "frozen") + "/optim.pt");
  EXPECT_GE(optim_drop, 2 * block0) << "optim.pt shrank by " << optim_drop << " bytes";
  EXPECT_LT(optim_drop, 2 * block0 + 4096);
  const auto [trainable, total] = parameter_counts(frozen.err);
  EXPECT_EQ(total - trainable, 784 * 256 + 256) << frozen.err;
  // The frozen layer's weights are those it started with.
  const NamedTensors weights =
      unpickle_tensors(slurp(newest(dir / "frozen") + "/model.pt"), "model.pt");
  const NamedTensors first = unpickle_tensors(slurp(newest(dir / "all") + "/model.pt"), "model.pt");
  ASSERT_EQ(weights[0].first, "block0.1.weight");
  EXPECT_FALSE(at::equal(weights[0].second, first[0].second));  // all: trained
  // plan --json: the estimate's gradients and optimizer state drop by block0's share.
  Result plan_all = run_gpurun({"plan", config, "--json", "--set", "optim.name=adam"});
  Result plan_frozen = run_gpurun(
      {"plan", config, "--json", "--set", "optim.name=adam", "--set", "model.freeze=[block0.*]"});
  ASSERT_EQ(plan_all.exit_code, 0) << plan_all.err;
  ASSERT_EQ(plan_frozen.exit_code, 0) << plan_frozen.err;
  const auto a = nlohmann::json::parse(plan_all.out)["breakdown"];
  const auto f = nlohmann::json::parse(plan_frozen.out)["breakdown"];
  EXPECT_EQ(a["optimizer_state"].get<int64_t>() - f["optimizer_state"].get<int64_t>(), 2 * block0);
  EXPECT_EQ(a["gradients"].get<int64_t>() - f["gradients"].get<int64_t>(), block0);
  Result typo = run_gpurun({config, "--ckpt", dir / "typo", "--set", "model.freeze=[blok0.*]"});
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_TRUE(contains(typo.err, "\"blok0.*\" matches no parameter")) << typo.err;
  Result everything =
      run_gpurun({config, "--ckpt", dir / "everything", "--set", "model.freeze=[\"*\"]"});
  EXPECT_EQ(everything.exit_code, 2);
  EXPECT_TRUE(contains(everything.err, "leaves no parameter to train")) << everything.err;
}

/// Python: an mlp [64] with gpurun's parameter names, saved with torch.save(state_dict()); and
/// the cross-entropy of the first step's samples (the trace's first line) under those weights,
/// Fashion-MNIST normalised as the idx dataset does.
const char* kInitScript = R"(import gzip, os, sys, torch
mode, weights, trace, train = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
class Net(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.block0 = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, hidden), torch.nn.ReLU())
        self.head = torch.nn.Sequential(torch.nn.Linear(hidden, 10))
    def forward(self, x):
        return self.head(self.block0(x))
torch.manual_seed(123)
if mode == "save":
    torch.save(Net(64).state_dict(), weights)
    torch.save(Net(32).state_dict(), weights + ".narrow")
    sys.exit(0)
net = Net(64)
net.load_state_dict(torch.load(weights))
def idx(name, header):
    d = "/usr/share/datasets/fashion-mnist/"
    path = d + name if os.path.exists(d + name) else d + name + ".gz"
    raw = (gzip.open if path.endswith(".gz") else open)(path, "rb").read()
    return torch.frombuffer(bytearray(raw[header:]), dtype=torch.uint8)
images = idx("train-images-idx3-ubyte", 16).view(-1, 28, 28)[:train].float().div(255)
labels = idx("train-labels-idx1-ubyte", 8)[:train].long()
mean, std = images.mean().item(), images.std().item()
first = [int(v) for v in open(trace).readline().split()[2:]]
x = images[first].sub(mean).div(std).unsqueeze(1)
with torch.no_grad():
    print(repr(torch.nn.functional.cross_entropy(net(x), labels[first]).item()))
)";

TEST(InitFrom, APythonSavedStateDictGivesPythonsFirstLossAndAShapeMismatchExitsTwo) {
  TempDir dir;
  const std::string script = dir / "init.py", weights = dir / "init.pt";
  std::ofstream(script) << kInitScript;
  Result saved = run_program({kPython, script, "save", weights, "-", "0"});
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  const std::string config = write_config(dir, small_config(480, 40, 1));
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt", "--set", "model.init_from=" + weights},
                        {{"GPURUN_TRACE_SAMPLES", dir / "trace"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "model.init_from: loaded 4 tensors from " + weights)) << r.err;
  const auto steps = events(dir / "ckpt", "step");
  ASSERT_FALSE(steps.empty());
  ASSERT_EQ(steps[0]["global_step"], 1);
  Result python = run_program({kPython, script, "loss", weights, dir / "trace", "480"});
  ASSERT_EQ(python.exit_code, 0) << python.err;
  const double theirs = std::stod(python.out), ours = steps[0]["loss"];
  EXPECT_NEAR(ours, theirs, 1e-5 * theirs) << "gpurun " << ours << ", Python " << theirs;
  // The file's xxh3 is in the manifest, and a resume keeps recording it without reading it.
  const nlohmann::json init = inspect(dir / "ckpt")["extra"]["init_from"];
  EXPECT_EQ(init["path"], weights);
  EXPECT_EQ(init["xxh3"].get<std::string>().size(), 16u);
  ASSERT_EQ(::unlink(weights.c_str()), 0);
  Result resumed = run_gpurun({config, "--ckpt", dir / "ckpt", "--resume", "--set",
                               "model.init_from=" + weights, "--set", "train.epochs=2"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(inspect(dir / "ckpt")["extra"]["init_from"], init);

  Result narrow = run_gpurun(
      {config, "--ckpt", dir / "narrow", "--set", "model.init_from=" + weights + ".narrow"});
  EXPECT_EQ(narrow.exit_code, 2) << narrow.err;
  EXPECT_TRUE(contains(narrow.err, "block0.1.weight: the file has [32, 784], the model [64, 784]"))
      << narrow.err;
  EXPECT_FALSE(stdfs::exists(dir / "narrow/LATEST"));
}

/// A character-level gpt of width 128 on the King James Bible (Debian's `bible`).
std::string gpt_config(const TempDir& dir, int train, int epochs) {
  Result text = run_program({"/usr/bin/bible", "-l100000", "Gen1:1-Rev22:21"});
  EXPECT_EQ(text.exit_code, 0) << text.err;
  std::ofstream(dir / "kjv.txt", std::ios::binary) << text.out;
  std::ostringstream y;
  y << "model: {name: gpt, layers: 2, heads: 4, width: 128, dropout: 0.1}\n"
    << "data: {name: text, path: " << (dir / "kjv.txt") << ", context: 32, train_samples: " << train
    << ", eval_samples: 160}\n"
    << "optim: {name: adamw, lr: 0.003}\n"
    << "train: {epochs: " << epochs
    << ", batch_size: 32, eval_batch_size: 80, seed: 4, threads: 1}\n"
    << "sample: {length: 0}\nlog: {every_steps: 1}\n";
  return write_config(dir, y.str());
}

const std::vector<std::string> kLora{
    "model.lora.rank=8", "model.lora.alpha=16",
    "model.lora.targets=[\"*.attention.*\",\"*.expand\",\"*.contract\"]"};

/// Python: the gpt of plugins/gpt.cpp, loaded strictly from the merged export, and its logits
/// on the ids gpurun's own logits were computed for, compared.
const char* kGptScript = R"(import math, sys, torch
from torch import nn
merged, theirs, width, heads, layers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
class Embedding(nn.Module):
    def __init__(s, v, c, w):
        super().__init__(); s.tokens = nn.Embedding(v, w); s.positions = nn.Embedding(c, w)
    def forward(s, ids):
        return s.tokens(ids) + s.positions(torch.arange(ids.shape[1]))
class Attention(nn.Module):
    def __init__(s, w, h):
        super().__init__(); s.h = h; s.qkv = nn.Linear(w, 3 * w); s.projection = nn.Linear(w, w)
    def forward(s, x):
        b, t, w = x.shape; hw = w // s.h
        q, k, v = s.qkv(x).view(b, t, 3, s.h, hw).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hw))
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        return s.projection((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, w))
class Block(nn.Module):
    def __init__(s, w, h):
        super().__init__()
        s.norm1 = nn.LayerNorm(w); s.attention = Attention(w, h); s.norm2 = nn.LayerNorm(w)
        s.expand = nn.Linear(w, 4 * w); s.contract = nn.Linear(4 * w, w)
    def forward(s, x):
        x = x + s.attention(s.norm1(x))
        return x + s.contract(nn.functional.gelu(s.expand(s.norm2(x))))
state = torch.load(merged)
vocabulary, context = state["embed.0.tokens.weight"].shape[0], state["embed.0.positions.weight"].shape[0]
model = nn.Module()
model.embed = nn.Sequential(Embedding(vocabulary, context, width))
for i in range(layers):
    setattr(model, "block%d" % i, nn.Sequential(Block(width, heads)))
model.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, vocabulary, bias=False))
model.load_state_dict(state, strict=True)
model.eval()
given = torch.load(theirs)
x = model.embed(given["ids"])
for i in range(layers):
    x = getattr(model, "block%d" % i)(x)
with torch.no_grad():
    logits = model.head(x)
print(repr((logits - given["logits"]).abs().max().item()))
)";

/// gpurun's logits for `ids` from the LoRA checkpoint `ckpt_dir` (its adapters unmerged), as
/// the trainer's model computes them: the gpt of its config with adapters, loaded strictly.
at::Tensor gpurun_logits(const std::string& checkpoint, const at::Tensor& ids, int64_t vocabulary) {
  const nlohmann::json manifest = nlohmann::json::parse(slurp(checkpoint + "/manifest.json"));
  const RunConfig config = config_from_json(manifest["config"]);
  Registry registry;
  register_builtin_plugins(registry);
  auto model = registry.make_model(config.model, {config.data.context}, vocabulary);
  add_lora_adapters(*model, config.model.lora);
  load_initial_weights(*model, checkpoint + "/model.pt", /*strict=*/true);
  model->eval();
  torch::NoGradGuard no_grad;
  return model->forward(ids);
}

TEST(Lora, OnTheGptCutsTrainableParametersTrainsFromAnEarlierGptAndMergesToItsLogits) {
  TempDir dir;
  const std::string config = gpt_config(dir, 1600, 1);
  // The base: a gpt trained by gpurun, then fine-tuned with LoRA from its export.
  Result base = run_gpurun({config, "--ckpt", dir / "base"});
  ASSERT_EQ(base.exit_code, 0) << base.err;
  Result exported = run_gpurun({"export", dir / "base", "--to", dir / "base.pt"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  std::vector<std::string> sets = kLora;
  sets.push_back("model.init_from=" + dir / "base.pt");
  Result lora = run_gpurun(with_sets({config, "--ckpt", dir / "lora"}, sets));
  ASSERT_EQ(lora.exit_code, 0) << lora.err;

  const auto [full_trainable, full_total] = parameter_counts(base.err);
  const auto [lora_trainable, lora_total] = parameter_counts(lora.err);
  EXPECT_EQ(full_trainable, full_total);
  const double fall = 1.0 - static_cast<double>(lora_trainable) / full_trainable;
  EXPECT_GE(fall, 0.90) << lora_trainable << " of " << full_trainable;
  const int64_t optim_full = file_size(newest(dir / "base") + "/optim.pt");
  const int64_t optim_lora = file_size(newest(dir / "lora") + "/optim.pt");
  const double optim_fall = 1.0 - static_cast<double>(optim_lora) / optim_full;
  EXPECT_GE(optim_fall, 0.85) << optim_lora << " of " << optim_full << " bytes";
  std::printf(
      "LoRA rank 8: trainable parameters %lld of %lld (-%.1f%%); optim.pt %lld of %lld "
      "bytes (-%.1f%%)\n",
      static_cast<long long>(lora_trainable), static_cast<long long>(full_trainable), 100 * fall,
      static_cast<long long>(optim_lora), static_cast<long long>(optim_full), 100 * optim_fall);
  // Training the adapters from the earlier gpt lowers its loss on the evaluation text.
  const double base_eval = events(dir / "base", "epoch").back()["eval_loss"];
  const auto lora_steps = events(dir / "lora", "step");
  ASSERT_FALSE(lora_steps.empty());
  const double lora_eval = events(dir / "lora", "epoch").back()["eval_loss"];
  EXPECT_LT(lora_eval, base_eval);
  EXPECT_LT(lora_steps.back()["loss"].get<double>(), lora_steps.front()["loss"].get<double>());

  // The merged export: plain weights of the base architecture, gpurun's logits in Python.
  Result merged = run_gpurun({"export", dir / "lora", "--to", dir / "merged.pt", "--merge-lora"});
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  const NamedTensors merged_state = unpickle_tensors(slurp(dir / "merged.pt"), "merged.pt");
  const NamedTensors base_state = unpickle_tensors(slurp(dir / "base.pt"), "base.pt");
  ASSERT_EQ(merged_state.size(), base_state.size());
  const int64_t vocabulary = base_state[0].second.size(0);
  torch::manual_seed(1);
  const at::Tensor ids = at::arange(2 * 32, at::kLong).remainder(vocabulary).view({2, 32});
  const at::Tensor logits = gpurun_logits(newest(dir / "lora"), ids, vocabulary);
  fs::replace_file(dir / "logits.pt", pickle_tensors({{"ids", ids}, {"logits", logits}}));
  const std::string script = dir / "gpt.py";
  std::ofstream(script) << kGptScript;
  Result python =
      run_program({kPython, script, dir / "merged.pt", dir / "logits.pt", "128", "4", "2"});
  ASSERT_EQ(python.exit_code, 0) << python.err;
  EXPECT_LE(std::stod(python.out), 1e-5) << "largest logit difference " << python.out;
  Result refused = run_gpurun({"export", dir / "base", "--to", dir / "x.pt", "--merge-lora"});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_TRUE(contains(refused.err, "without model.lora")) << refused.err;
}

TEST(Lora, SigkilledAndResumedEndsWithTheUninterruptedDigest) {
  TempDir dir;
  const std::string config = gpt_config(dir, 960, 2);
  std::vector<std::string> sets = kLora;
  sets.push_back("model.lora.dropout=0.1");
  sets.push_back("checkpoint.every_steps=5");
  Result reference = run_gpurun(with_sets({config, "--ckpt", dir / "reference"}, sets));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const std::string expected = inspect(dir / "reference").value("model_digest", "");
  const std::string ckpt = dir / "ckpt";
  EXPECT_GE(sigkill_after_checkpoints(with_sets({config, "--ckpt", ckpt, "--resume"}, sets), ckpt,
                                      dir / "run", 3),
            3);
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""), expected);
}

}  // namespace
}  // namespace gpurun::test

// Fine-tuning Hugging Face models through the real binary (issue 41). The models are made at
// test time by transformers' save_pretrained (tests/tools/hf/make_tiny.py, in the pinned venv of
// scripts/install-deps.sh --print-hf-python), and every loss is checked against transformers'
// own (tests/tools/hf/reference_loss.py): the forward pass of each architecture, a full
// fine-tune exported with --format hf, a LoRA exported with --format peft and merged, a loss
// mask; then exact resume after SIGKILL, the bad inputs that must exit 2 before anything is
// written, and `gpurun plan` of the published Llama configs.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include <ATen/ops/randn.h>

#include "checkpoint/format/safetensors.h"
#include "integration/harness.h"
#include "util/fs.h"

namespace gpurun::test {
namespace {

namespace stdfs = std::filesystem;

/// The Python of the Hugging Face tools, asked of install-deps.sh once; "" when it is missing.
const std::string& hf_python() {
  static const std::string python = [] {
    const Result r =
        run_program({"/bin/bash", std::string(GPURUN_SOURCE_DIR) + "/scripts/install-deps.sh",
                     "--print-hf-python"});
    return r.exit_code == 0 ? trimmed(r.out) : std::string();
  }();
  return python;
}

std::string tool(const std::string& name) {
  return std::string(GPURUN_SOURCE_DIR) + "/tests/tools/hf/" + name;
}

/// Runs a tools script with the HF Python; fails the test on a non-zero exit.
std::string python(std::vector<std::string> args, double timeout = 300) {
  args.insert(args.begin(), hf_python());
  const Result r = run_program(args, timeout);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return r.out;
}

/// reference_loss.py's loss for `model` (and `extra` arguments) on the eval tokens.
double reference_loss(const std::string& model, const std::string& tokens,
                      std::vector<std::string> extra = {}) {
  std::vector<std::string> args{
      tool("reference_loss.py"), "--model", model, "--tokens", tokens, "--context", "32"};
  args.insert(args.end(), extra.begin(), extra.end());
  const std::string out = python(args);
  const auto j = nlohmann::json::parse(out.substr(out.rfind('{')), nullptr, false);
  return j.is_object() ? j.value("loss", NAN) : NAN;
}

double last_eval_loss(const std::string& run_dir) {
  const auto epochs = events(run_dir, "epoch");
  return epochs.empty() ? NAN : epochs.back()["eval_loss"].get<double>();
}

void expect_relative(double value, double expected, double tolerance, const std::string& what) {
  EXPECT_LE(std::abs(value - expected), tolerance * std::abs(expected))
      << what << ": " << value << " vs transformers' " << expected;
}

class Hf : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(hf_python().empty()) << "no Hugging Face tools: run scripts/install-deps.sh";
    python({tool("make_tiny.py"),
            "tokens",
            "--tokens",
            dir_ / "train.bin",
            "--eval-tokens",
            dir_ / "val.bin",
            "--n-tokens",
            "4000",
            "--n-eval-tokens",
            "1000",
            "--vocab",
            "512",
            "--context",
            "32",
            "--mask",
            dir_ / "train.mask",
            "--eval-mask",
            dir_ / "val.mask",
            "--mask-mode",
            "first-half"});
  }

  /// A model made by save_pretrained into dir_/name with make_tiny.py's `args`.
  std::string model(const std::string& name, std::vector<std::string> args = {}) {
    std::vector<std::string> all{tool("make_tiny.py"), "model", dir_ / name};
    all.insert(all.end(), args.begin(), args.end());
    python(all);
    return dir_ / name;
  }

  /// A run of `model` on the tokens: sequential windows of 32, 4 a batch, 30 steps an epoch.
  std::string config(const std::string& model, const std::string& extra = "") {
    return write_config(dir_,
                        "model: {name: hf, path: " + model + "}\n" + "data: {name: tokens, path: " +
                            (dir_ / "train.bin") + ", eval_path: " + (dir_ / "val.bin") +
                            ", context: 32, windows: sequential, train_samples: 120, workers: 0}\n"
                            "train: {epochs: 1, batch_size: 4, eval_batch_size: 8, seed: 1, "
                            "threads: 1}\n"
                            "log: {every_steps: 1}\n" +
                            extra,
                        "run.yaml");
  }

  TempDir dir_;
};

/// One epoch whose learning rate moves no weight: gpurun's eval_loss is transformers' loss.
void expect_forward_matches(const std::string& model, const std::string& config,
                            const std::string& ckpt, const std::string& what) {
  const Result run =
      run_gpurun(with_sets({config, "--ckpt", ckpt}, {"optim.name=sgd", "optim.lr=1e-30"}));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string val = stdfs::path(config).parent_path() / "val.bin";
  expect_relative(last_eval_loss(ckpt), reference_loss(model, val), 1e-5, what);
}

TEST_F(Hf, EveryArchitecturesEvalLossIsTransformersLoss) {
  struct Case {
    std::string name;
    std::vector<std::string> args;
  };
  const std::vector<Case> cases = {
      {"llama", {"--arch", "llama", "--max-shard-size", "40KB"}},
      {"llama_tied_llama3",
       {"--arch", "llama", "--tied", "--rope-scaling", "llama3", "--rope-original-max", "16",
        "--config-style", "v4"}},
      {"llama_linear", {"--arch", "llama", "--rope-scaling", "linear", "--rope-factor", "2"}},
      {"mistral", {"--arch", "mistral"}},
      {"qwen2_tied", {"--arch", "qwen2", "--tied"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string m = model(c.name, c.args);
    expect_forward_matches(m, config(m), dir_ / ("ckpt_" + c.name), c.name);
  }
}

TEST_F(Hf, AFullFineTuneExportsAFolderTransformersLoadsWithGpurunsLoss) {
  const std::string m = model("base", {"--arch", "llama", "--max-shard-size", "40KB"});
  const std::string ckpt = dir_ / "ckpt";
  const Result run =
      run_gpurun(with_sets({config(m), "--ckpt", ckpt}, {"optim.name=adamw", "optim.lr=0.003"}));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(events(ckpt, "step").size(), 30u);
  const auto weights = events(ckpt, "weights");
  ASSERT_EQ(weights.size(), 1u);
  EXPECT_EQ(weights[0]["dtype"], "float32");
  const std::string out = dir_ / "exported";
  const Result ok =
      run_gpurun({"export", ckpt, "--to", out, "--format", "hf", "--max-shard-size", "100KB"});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(contains(ok.out, "Hugging Face model folder")) << ok.out;
  EXPECT_TRUE(stdfs::exists(out + "/config.json"));
  // The keys and dtypes of the input, sharded (100 KB a file: several, with their index).
  const auto keys =
      nlohmann::json::parse(python({tool("reference_loss.py"), "--model", m, "--check-keys", out}));
  EXPECT_TRUE(keys.value("identical", false)) << keys.dump();
  EXPECT_TRUE(stdfs::exists(out + "/model.safetensors.index.json"));
  expect_relative(reference_loss(out, dir_ / "val.bin"), last_eval_loss(ckpt), 1e-5,
                  "the export's loss");
  // A second export to the same folder is refused: nothing is overwritten.
  EXPECT_EQ(run_gpurun({"export", ckpt, "--to", out, "--format", "hf"}).exit_code, 2);
}

TEST_F(Hf, ALoraExportsAPeftAdapterAndAMergedModelWithGpurunsLoss) {
  const std::string m = model("base", {"--arch", "qwen2"});
  const std::string ckpt = dir_ / "ckpt";
  const Result run = run_gpurun(
      with_sets({config(m), "--ckpt", ckpt},
                {"optim.name=adamw", "optim.lr=0.01", "model.lora.rank=4", "model.lora.alpha=8",
                 "model.lora.targets=[\"*.q_proj\", \"*.v_proj\"]"}));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const double loss = last_eval_loss(ckpt);
  // Without --merge-lora a whole model would leave the adapters out: refused.
  EXPECT_EQ(run_gpurun({"export", ckpt, "--to", dir_ / "plain", "--format", "hf"}).exit_code, 2);
  const Result adapter = run_gpurun({"export", ckpt, "--to", dir_ / "adapter", "--format", "peft"});
  ASSERT_EQ(adapter.exit_code, 0) << adapter.err;
  const auto adapter_config = nlohmann::json::parse(slurp(dir_ / "adapter/adapter_config.json"));
  EXPECT_EQ(adapter_config["r"], 4);
  EXPECT_EQ(adapter_config["lora_alpha"], 8.0);
  EXPECT_EQ(adapter_config["target_modules"], nlohmann::json({"q_proj", "v_proj"}));
  expect_relative(reference_loss(m, dir_ / "val.bin", {"--adapter", dir_ / "adapter"}), loss, 1e-5,
                  "PeftModel.from_pretrained(base, adapter)");
  const Result merged =
      run_gpurun({"export", ckpt, "--to", dir_ / "merged", "--format", "hf", "--merge-lora"});
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  expect_relative(reference_loss(dir_ / "merged", dir_ / "val.bin"), loss, 1e-5,
                  "the merged export");
}

TEST_F(Hf, AMaskedLossIsTransformersLossWithIgnoredLabels) {
  const std::string m = model("base", {"--arch", "llama"});
  const std::string ckpt = dir_ / "ckpt";
  const std::string c = config(m);
  const Result run =
      run_gpurun(with_sets({c, "--ckpt", ckpt}, {"optim.name=sgd", "optim.lr=1e-30",
                                                 "data.mask_path=" + (dir_ / "train.mask"),
                                                 "data.eval_mask_path=" + (dir_ / "val.mask")}));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const double masked = last_eval_loss(ckpt);
  expect_relative(masked, reference_loss(m, dir_ / "val.bin", {"--mask", dir_ / "val.mask"}), 1e-5,
                  "masked");
  // And not the unmasked loss: half the targets are left out.
  EXPECT_GT(std::abs(masked - reference_loss(m, dir_ / "val.bin")), 1e-4);
  // A mask of another length, one holding a 2 (where no window reads), one whose evaluation
  // tokens all are 0: each refused at set-up, naming it.
  std::string two = slurp(dir_ / "train.mask");
  two[3990] = '\2';
  fs::replace_file(dir_ / "two.mask", two);
  std::string none = slurp(dir_ / "val.mask");
  std::fill(none.begin(), none.end(), '\0');
  fs::replace_file(dir_ / "none.mask", none);
  fs::replace_file(dir_ / "short.mask", std::string(100, '\1'));
  for (const auto& [set, expected] :
       {std::pair<std::string, std::string>{"data.mask_path=" + (dir_ / "short.mask"), "100 bytes"},
        {"data.mask_path=" + (dir_ / "two.mask"), "holds 2 at byte 3990"},
        {"data.eval_mask_path=" + (dir_ / "none.mask"), "counts no target"}}) {
    const Result bad = run_gpurun(with_sets({c, "--ckpt", dir_ / "bad"}, {set}));
    EXPECT_EQ(bad.exit_code, 2) << set;
    EXPECT_TRUE(contains(bad.err, expected)) << bad.err;
    EXPECT_FALSE(stdfs::exists(dir_ / "bad/metrics.jsonl")) << set;
  }
}

TEST_F(Hf, ABf16LoraFineTuneSigkilledAndResumedEndsWithTheUninterruptedDigest) {
  const std::string m = model("base", {"--arch", "llama", "--dtype", "bfloat16"});
  const std::string c = config(m, "checkpoint: {every_steps: 5, async: false}\n");
  const std::vector<std::string> sets{
      "optim.name=adamw",     "optim.lr=0.01",
      "train.precision=bf16", "optim.master_weights=true",
      "model.lora.rank=4",    "model.lora.targets=[\"*.q_proj\", \"*.v_proj\"]",
      "train.epochs=2"};
  const Result reference = run_gpurun(with_sets({c, "--ckpt", dir_ / "reference"}, sets));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const std::string ckpt = dir_ / "killed";
  EXPECT_GE(sigkill_after_checkpoints(with_sets({c, "--ckpt", ckpt, "--resume"}, sets), ckpt,
                                      dir_ / "run", 3),
            3);
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""),
            inspect(dir_ / "reference").value("model_digest", ""));
  // The resumed run's checkpoint still exports in the input's dtype.
  const Result merged =
      run_gpurun({"export", ckpt, "--to", dir_ / "merged", "--format", "hf", "--merge-lora"});
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  EXPECT_TRUE(contains(merged.out, "bfloat16")) << merged.out;
}

TEST_F(Hf, AResumeRefusesAnotherConfigJsonAndFollowsAMovedFolder) {
  const std::string m = model("base", {"--arch", "llama"});
  const std::string c = config(m);
  const std::string ckpt = dir_ / "ckpt";
  ASSERT_EQ(run_gpurun({c, "--ckpt", ckpt}).exit_code, 0);
  // Another rope_theta builds another model: refused, naming the key and both values.
  const std::string original = slurp(m + "/config.json");
  auto edited = nlohmann::json::parse(original);
  edited["rms_norm_eps"] = 0.01;
  fs::replace_file(m + "/config.json", edited.dump());
  const Result refused = run_gpurun(with_sets({c, "--ckpt", ckpt, "--resume"}, {"train.epochs=2"}));
  EXPECT_EQ(refused.exit_code, 3) << refused.err;
  EXPECT_TRUE(contains(refused.err, "rms_norm_eps: 1e-06 -> 0.01")) << refused.err;
  // The folder mounted elsewhere on a new machine: model.path is not a training key.
  fs::replace_file(m + "/config.json", original);
  stdfs::rename(m, dir_ / "moved");
  const Result moved = run_gpurun(with_sets({c, "--ckpt", ckpt, "--resume"},
                                            {"train.epochs=2", "model.path=" + (dir_ / "moved")}));
  EXPECT_EQ(moved.exit_code, 0) << moved.err;
  EXPECT_EQ(events(ckpt, "resume").size(), 1u);
}

TEST_F(Hf, TwoRanksShardedWithMasterWeightsResumeToTheUninterruptedDigest) {
  const std::string m = model("base", {"--arch", "qwen2", "--dtype", "bfloat16"});
  const std::string c = config(m, "checkpoint: {every_steps: 4, async: false}\n");
  const auto args = [&](const std::string& ckpt) {
    return with_sets({c, "--ckpt", ckpt, "--nproc-per-node", "2"},
                     {"optim.name=adamw", "optim.lr=0.003", "train.precision=bf16",
                      "optim.master_weights=true", "distributed.shard=optimizer"});
  };
  const Result reference = run_gpurun(args(dir_ / "reference"));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const std::string ckpt = dir_ / "killed";
  const Result killed = run_gpurun(args(ckpt), {{"GPURUN_FAULT", "sigkill:after_step:13"}});
  EXPECT_EQ(killed.exit_code, 1) << killed.err;
  EXPECT_EQ(inspect(ckpt).value("global_step", -1), 12);
  std::vector<std::string> resume = args(ckpt);
  resume.push_back("--resume");
  const Result resumed = run_gpurun(resume);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""),
            inspect(dir_ / "reference").value("model_digest", ""));
  // Exported from the shard files' fp32 master, in the input's bf16.
  const Result exported = run_gpurun({"export", ckpt, "--to", dir_ / "out", "--format", "hf"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  const auto keys = nlohmann::json::parse(
      python({tool("reference_loss.py"), "--model", m, "--check-keys", dir_ / "out"}));
  EXPECT_TRUE(keys.value("identical", false)) << keys.dump();
}

TEST_F(Hf, ThePlansEstimateIsWithinTenPercentOfTheProbe) {
  // 4 layers of 256, grouped-query attention (4 heads, 2 for keys and values), SwiGLU of 688,
  // context 256: activations dominate, as they do for the large models the estimate is for.
  const std::string m =
      model("mid", {"--arch", "llama", "--layers", "4", "--hidden", "256", "--intermediate", "688",
                    "--vocab", "4096", "--max-positions", "256"});
  stdfs::create_directories(dir_ / "mid_data");
  python({tool("make_tiny.py"), "tokens", "--tokens", dir_ / "mid_data/train.bin", "--n-tokens",
          "40000", "--vocab", "4096"});
  const std::string c =
      write_config(dir_,
                   "model: {name: hf, path: " + m + "}\n" +
                       "data: {name: tokens, path: " + (dir_ / "mid_data/train.bin") +
                       ", context: 256, workers: 0, eval_samples: 8}\n"
                       "optim: {name: adamw, lr: 0.0001}\n"
                       "train: {epochs: 1, batch_size: 8, eval_batch_size: 8, threads: 1}\n"
                       "memory: {strategy: none, probe_steps: 1}\n",
                   "mid.yaml");
  const std::vector<std::vector<std::string>> variants = {
      {"train.precision=fp32"},
      {"train.precision=bf16"},
      {"train.precision=bf16", "optim.master_weights=true"},
      {"train.precision=fp32", "memory.strategy=checkpoint"}};
  for (const auto& sets : variants) {
    SCOPED_TRACE(sets.back());
    std::vector<std::string> args = with_sets({"plan", c, "--json"}, sets);
    const Result plan = run_gpurun(args, {}, 300);
    ASSERT_EQ(plan.exit_code, 0) << plan.err;
    const nlohmann::json j = nlohmann::json::parse(plan.out);
    const double estimated = j["estimate"]["total"].get<double>();
    const double measured = j["measured_peaks"]["training"].get<double>();
    EXPECT_LE(std::abs(estimated - measured), 0.10 * measured)
        << "estimated " << estimated << ", measured " << measured;
  }
}

/// Rewrites `path` with tensor `name`'s data_offsets end moved `extra` bytes past the data.
void move_end_past_the_file(const std::string& path, const std::string& name, int64_t extra) {
  std::string bytes = fs::read_file(path);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i)
    length = (length << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, length));
  const int64_t data = static_cast<int64_t>(bytes.size() - 8 - length);
  header[name]["data_offsets"][1] = data + extra;
  std::string text = header.dump();
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i)
    prefix[static_cast<size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  fs::replace_file(path, prefix + text + bytes.substr(8 + length));
}

TEST_F(Hf, BadInputsExitTwoNamingTheFileAndTheKeyAndWriteNothing) {
  const auto refused = [&](const std::string& model, const std::vector<std::string>& expected) {
    const std::string ckpt = dir_ / "ckpt";
    const Result run = run_gpurun({config(model), "--ckpt", ckpt});
    EXPECT_EQ(run.exit_code, 2) << run.err;
    for (const std::string& part : expected)
      EXPECT_TRUE(contains(run.err, part)) << part << "\n" << run.err;
    std::error_code ec;
    EXPECT_TRUE(!stdfs::exists(ckpt) || stdfs::is_empty(ckpt, ec)) << "something under --ckpt";
  };
  {  // A missing tensor: the file rewritten without one.
    const std::string m = model("missing", {"--arch", "llama"});
    SafetensorsFile file(m + "/model.safetensors");
    std::vector<SafetensorsSpec> specs;
    std::vector<at::Tensor> values;
    for (const auto& e : file.entries()) {
      if (e.name == "model.layers.1.mlp.up_proj.weight") continue;
      specs.push_back({e.name, e.dtype, e.shape});
      values.push_back(file.view(e).clone());
    }
    write_safetensors(m + "/model.safetensors.new", specs, [&](size_t i) { return values[i]; });
    stdfs::rename(m + "/model.safetensors.new", m + "/model.safetensors");
    refused(m, {m, "model.layers.1.mlp.up_proj.weight", "missing"});
  }
  {  // A shard listed in the index but absent.
    const std::string m = model("absent", {"--arch", "llama", "--max-shard-size", "40KB"});
    const auto index = nlohmann::json::parse(slurp(m + "/model.safetensors.index.json"));
    const std::string shard = index["weight_map"].begin().value().get<std::string>();
    stdfs::remove(m + "/" + shard);
    refused(m, {"model.safetensors.index.json", shard, "weight_map."});
  }
  {  // A truncated file.
    const std::string m = model("truncated", {"--arch", "llama"});
    stdfs::resize_file(m + "/model.safetensors", stdfs::file_size(m + "/model.safetensors") - 100);
    refused(m, {m + "/model.safetensors", "run past the end", "cut short"});
  }
  {  // A header whose offsets run past the end.
    const std::string m = model("offsets", {"--arch", "llama"});
    move_end_past_the_file(m + "/model.safetensors", "model.norm.weight", 4096);
    refused(m, {m + "/model.safetensors", "tensor model.norm.weight", "run past the end"});
  }
  {  // An unsupported architecture.
    const std::string m = model("gpt2", {"--arch", "llama"});
    auto config_json = nlohmann::json::parse(slurp(m + "/config.json"));
    config_json["architectures"] = {"GPT2LMHeadModel"};
    fs::replace_file(m + "/config.json", config_json.dump());
    refused(m, {m + "/config.json", "architectures", "GPT2LMHeadModel", "LlamaForCausalLM"});
  }
}

// A Llama of 1.0 GB in bf16 (34 layers of 1024, vocab 32000), its weights written here: loading
// it for bf16 training with master weights holds the model and one tensor, not the file, nor an
// fp32 copy of the model (built without writing its pages, converted to 16 bits, then filled).
TEST(HfMemory, LoadingAGigabyteBf16ModelPeaksBelow1Point3GBAboveTheBaseline) {
  TempDir dir;
  const std::string folder = dir / "model";
  stdfs::create_directories(folder);
  const std::string config_json =
      R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 2816,
      "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 8,
      "vocab_size": 32000, "rms_norm_eps": 1e-05, "hidden_act": "silu",
      "max_position_embeddings": 64, "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";
  fs::replace_file(folder + "/config.json", config_json);
  std::vector<SafetensorsSpec> specs;
  const auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    specs.push_back({name, at::kBFloat16, std::move(shape)});
  };
  add("model.embed_tokens.weight", {32000, 1024});
  for (int i = 0; i < 34; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"})
      add(p + "self_attn." + proj + ".weight", {1024, 1024});
    add(p + "mlp.gate_proj.weight", {2816, 1024});
    add(p + "mlp.up_proj.weight", {2816, 1024});
    add(p + "mlp.down_proj.weight", {1024, 2816});
    add(p + "input_layernorm.weight", {1024});
    add(p + "post_attention_layernorm.weight", {1024});
  }
  add("model.norm.weight", {1024});
  add("lm_head.weight", {32000, 1024});
  const int64_t bytes = write_safetensors(folder + "/model.safetensors", specs, [&](size_t i) {
    return at::randn(specs[i].shape).mul_(0.02).to(at::kBFloat16);
  });
  ASSERT_GT(bytes, 1'000'000'000);
  std::string tokens(2000 * 2, '\0');
  for (size_t i = 0; i < 2000; ++i) tokens[i * 2] = static_cast<char>(i % 251);
  fs::replace_file(dir / "tokens.bin", tokens);
  const std::string config = write_config(
      dir, "model: {name: hf, path: " + folder +
               ", lora: {rank: 1, targets: [model.layers.0.self_attn.q_proj]}}\n" +
               "data: {name: tokens, path: " + (dir / "tokens.bin") +
               ", context: 16, train_samples: 2, eval_samples: 2, workers: 0}\n"
               "optim: {name: adamw, lr: 0.001, master_weights: true}\n"
               "train: {epochs: 1, batch_size: 2, eval_batch_size: 2, precision: bf16}\n"
               "memory: {strategy: none, probe_steps: 1}\n");
  const Result run = run_gpurun({config, "--ckpt", dir / "ckpt"}, {}, 600);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto weights = events(dir / "ckpt", "weights");
  ASSERT_EQ(weights.size(), 1u);
  const int64_t peak = weights[0]["resident_peak_bytes"].get<int64_t>();
  const int64_t baseline = weights[0]["resident_before_model_bytes"].get<int64_t>();
  EXPECT_GT(weights[0]["bytes"].get<int64_t>(), 1'000'000'000);  // the tensors, header aside
  EXPECT_LT(weights[0]["bytes"].get<int64_t>(), bytes);
  EXPECT_EQ(weights[0]["dtype"], "bfloat16");
  // The model itself is resident (every page written by the copy), and little more.
  EXPECT_GT(peak - baseline, 900'000'000) << "peak " << peak << ", baseline " << baseline;
  EXPECT_LT(peak - baseline, 1'300'000'000) << "peak " << peak << ", baseline " << baseline;
}

/// Llama-2-7B's and Llama-3-8B's published config.json, alone in a folder.
const char* kLlama2 = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
  "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 32, "vocab_size": 32000, "rms_norm_eps": 1e-05, "hidden_act": "silu",
  "max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16", "model_type": "llama"})";
const char* kLlama3 = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
  "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-05, "hidden_act": "silu",
  "max_position_embeddings": 131072, "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0,
  "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
  "rope_type": "llama3"}, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "model_type": "llama"})";

TEST(HfPlan, PublishedLlamaConfigsAloneGiveCardsToFitInSeconds) {
  TempDir dir;
  // uint32 ids below 32000: both vocabularies take them.
  std::string tokens(30000 * 4, '\0');  // the last tenth (eval) holds a window of 2048
  for (size_t i = 0; i < 30000; ++i) tokens[i * 4] = static_cast<char>(i % 200);
  fs::replace_file(dir / "tokens.bin", tokens);
  const std::string cards = write_config(
      dir, "cards:\n  - {name: eighty, memory: 80GB, bf16_tflops: 989, price_per_hour: 3}\n",
      "cards.yaml");
  for (const auto& [name, json] : {std::pair{"llama2", kLlama2}, std::pair{"llama3", kLlama3}}) {
    SCOPED_TRACE(name);
    stdfs::create_directories(dir / name);
    fs::replace_file(dir / name + "/config.json", json);
    const std::string config =
        write_config(dir,
                     "model: {name: hf, path: " + (dir / name) + "}\n" +
                         "data: {name: tokens, path: " + (dir / "tokens.bin") +
                         ", dtype: uint32, context: 2048}\n"
                         "optim: {name: adamw, lr: 0.0001, master_weights: true}\n"
                         "train: {epochs: 1, batch_size: 8, precision: bf16}\n",
                     std::string(name) + ".yaml");
    const Result plan = run_gpurun({"plan", config, "--cards", cards, "--json"}, {}, 120);
    ASSERT_EQ(plan.exit_code, 0) << plan.err;
    EXPECT_LT(plan.seconds, 30) << plan.err;  // no weights read: seconds, not minutes
    const nlohmann::json j = nlohmann::json::parse(plan.out);
    EXPECT_EQ(j["estimate_only"], true);
    EXPECT_EQ(j["why"], "model.path holds config.json without weights");
    ASSERT_EQ(j["cards"].size(), 1u) << plan.out;
    const auto& card = j["cards"][0];
    ASSERT_TRUE(card["cards_to_fit"].is_number_integer()) << card;
    EXPECT_GE(card["cards_to_fit"].get<int64_t>(), 2) << card;
    EXPECT_LE(card["cards_to_fit"].get<int64_t>(), 8) << card;
  }
}

}  // namespace
}  // namespace gpurun::test

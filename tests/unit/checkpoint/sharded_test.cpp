// Sharded checkpoints (checkpoint/shard_index.h, shard_files.h, sharded_state.h and
// Checkpointer::save of a StepOptimizer): FlatOptimizer ranks as threads over Gloo on
// 127.0.0.1 save through the real Checkpointer, and ranks of another world size restore: the
// state they own equals the saved one bit for bit (resharding), also from and into an
// unsharded checkpoint; a damaged or missing shard, or a manifest that disagrees with its
// shards, is a damaged checkpoint.

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "common/temp_dir.h"

#include "checkpoint/checkpointer.h"
#include "checkpoint/format/export_state.h"
#include "checkpoint/format/folder.h"
#include "checkpoint/format/manifest.h"
#include "checkpoint/format/pickle.h"
#include "checkpoint/format/shard_index.h"
#include "checkpoint/format/sharded_state.h"
#include "distributed/collectives.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "optim/flat_optimizer.h"
#include "optim/step_optimizer.h"
#include "report/reporter.h"
#include "util/fs.h"
#include "util/rng.h"

namespace gpurun {
namespace {

using json = nlohmann::json;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

/// Parameters of 660, 33, 231 and 7 elements: at 64-element alignment, every world size of
/// these tests cuts some parameter between two ranks.
torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(20, 33), torch::nn::ReLU(),
                               torch::nn::Linear(33, 7));
}

Named trainable(const torch::nn::Module& model) {
  Named out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

OptimConfig adamw() {
  OptimConfig o;
  o.name = "adamw";
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  return o;
}

/// `steps` optimizer steps on data that depends on the rank and the step, not on any generator.
void train(torch::nn::Sequential& model, StepOptimizer& opt, int rank, int first, int steps) {
  for (int s = first; s < first + steps; ++s) {
    opt.zero_grad();
    const at::Tensor x =
        at::arange(160, at::kFloat)
            .reshape({8, 20})
            .mul(0.01 * (rank + 1) + 0.1 * s)
            .sin()
            .to(model->parameters().front().scalar_type());  // bf16 with master weights
    model->forward(x).pow(2).mean().backward();
    std::vector<double> control;
    opt.reduce_gradients(control);
    opt.step(1e-2, nullptr);
  }
}

/// Runs fn(rank, comm) on `world` threads joined over Gloo (world 1: this thread, no comm).
void run_ranks(int world, const std::function<void(int, Collectives*)>& fn) {
  if (world == 1) return fn(0, nullptr);
  const int port = find_free_port();
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::vector<std::string> errors;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        DistEnv env;
        env.rank = env.local_rank = rank;
        env.world_size = env.local_world_size = world;
        env.master_port = port;
        auto comm = Collectives::connect(env, c10::kCPU, 60);
        fn(rank, comm.get());
      } catch (const std::exception& e) {
        const std::lock_guard<std::mutex> lock(mutex);
        errors.push_back("rank " + std::to_string(rank) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
}

/// What a save held: every state's full tensor per parameter, the weights, the step count.
struct Saved {
  std::map<std::string, std::map<std::string, at::Tensor>> state;  // state -> parameter -> full
  Named weights;
  int64_t steps = 0;
  at::Tensor cpu_rng;
  std::string path;
  int world = 1;  ///< of the saving run: ranks beyond it find no generator state of theirs
};

CheckpointMeta meta_of(int64_t step, int world) {
  CheckpointMeta meta;
  meta.epoch = 0;
  meta.global_step = step;
  meta.world_size = world;
  meta.config_hash = "test";
  meta.config = {{"optim", {{"name", "adamw"}}}};
  meta.extra["grad_scaler"] = {{"scale", 1024.0}, {"growth_tracker", 3}};
  return meta;
}

/// Trains `world` flat ranks for 2 steps and saves into dir through the real Checkpointer.
Saved train_and_save(const std::string& dir, int world, bool master, int saves = 1) {
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < world; ++r) models.push_back(make_model(7));  // on this thread: one stream
  Saved saved;
  saved.world = world;
  saved.cpu_rng = rng_state(default_generator(at::kCPU));
  std::mutex mutex;
  std::map<std::string, at::Tensor> flat_state;  // state -> padded flat buffer
  run_ranks(world, [&](int rank, Collectives* comm) {
    FlatOptimizerOptions options;
    options.master_weights = master;
    FlatOptimizer opt(adamw(), options, trainable(*models[rank]), comm, rank, world);
    RunConfig config;
    config.checkpoint.async = rank % 2 == 0;  // both writer modes
    Reporter reporter(dir, rank == 0, rank);
    Checkpointer checkpointer(config, {dir, false, false}, reporter, comm);
    checkpointer.claim_directory();
    for (int s = 0; s < saves; ++s) {
      train(models[rank], opt, rank, 2 * s, 2);
      checkpointer.save(meta_of(2 * (s + 1), world), *models[rank], opt);
    }
    checkpointer.drain();
    const std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [name, t] : opt.state()) {
      at::Tensor& full = flat_state[name];
      if (!full.defined()) full = at::zeros({opt.layout().padded_numel()});
      full.narrow(0, opt.shard().begin, opt.shard().size()).copy_(t);
    }
    if (rank == 0) {
      for (const auto& [name, t] : state_dict(*models[rank]))
        saved.weights.emplace_back(name, t.clone());
      saved.steps = opt.step_count();
      saved.path = checkpointer.last_checkpoint();
    }
  });
  // Per parameter, from the assembled flat buffers (the layout of any rank: the same).
  FlatLayout layout(
      [&] {
        std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
        for (const auto& [name, p] : trainable(*models[0]))
          shapes.emplace_back(name, p.sizes().vec());
        return shapes;
      }(),
      world);
  for (const auto& [name, full] : flat_state)
    for (const FlatParameter& p : layout.parameters())
      saved.state[name][p.name] = full.narrow(0, p.offset, p.numel).view(p.shape).clone();
  return saved;
}

/// The expected slice of `rank` of `world` for state `name`, from the saved full tensors.
at::Tensor expected_slice(const Saved& saved, const std::string& name, const FlatLayout& layout,
                          int rank) {
  at::Tensor flat = at::zeros({layout.padded_numel()});
  for (const FlatParameter& p : layout.parameters())
    flat.narrow(0, p.offset, p.numel).copy_(saved.state.at(name).at(p.name).reshape({-1}));
  return flat.narrow(0, layout.shard(rank).begin, layout.shard_numel());
}

void expect_weights(const torch::nn::Module& model, const Saved& saved) {
  const Named live = state_dict(model);
  ASSERT_EQ(live.size(), saved.weights.size());
  for (size_t i = 0; i < live.size(); ++i)
    EXPECT_TRUE(torch::equal(live[i].second, saved.weights[i].second)) << live[i].first;
}

/// Resumes `saved` at `world` flat ranks: each rank's state, step, weights and (one process)
/// generator equal the saved ones bit for bit, and training goes on.
void resume_and_check(const Saved& saved, int world, bool master) {
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < world; ++r) models.push_back(make_model(1234));  // other weights
  torch::manual_seed(99);                                              // another generator state
  run_ranks(world, [&](int rank, Collectives* comm) {
    FlatOptimizerOptions options;
    options.master_weights = master;
    FlatOptimizer opt(adamw(), options, trainable(*models[rank]), comm, rank, world);
    const LoadedCheckpoint loaded = CheckpointStore::load(saved.path);
    EXPECT_EQ(loaded.meta.extra["grad_scaler"]["scale"], 1024.0);
    EXPECT_EQ(restore_state(loaded, *models[rank], opt, rank), rank < saved.world);
    EXPECT_EQ(opt.step_count(), saved.steps);
    for (const auto& [name, live] : opt.state())
      EXPECT_TRUE(torch::equal(live, expected_slice(saved, name, opt.layout(), rank)))
          << name << " of rank " << rank << " of " << world;
    expect_weights(*models[rank], saved);
    if (world == 1) {
      EXPECT_TRUE(torch::equal(rng_state(default_generator(at::kCPU)), saved.cpu_rng));
    }
    train(models[rank], opt, rank, 2, 1);  // the run continues
    for (const auto& [name, t] : state_dict(*models[rank]))
      EXPECT_TRUE(t.isfinite().all().item<bool>()) << name;
  });
}

void reshard(int from, int to, bool master = false) {
  test::TempDir dir("shard");
  const Saved saved = train_and_save(dir.path(), from, master);
  ASSERT_FALSE(saved.path.empty());
  const CheckpointInfo info = CheckpointView::inspect(saved.path, /*verify=*/true);
  ASSERT_TRUE(info.complete) << info.problem;
  EXPECT_EQ(info.manifest["format_version"], kShardedFormatVersion);
  EXPECT_FALSE(info.manifest["files"].contains("optim.pt"));
  for (int r = 0; r < from; ++r)
    EXPECT_TRUE(info.manifest["files"].contains(shard_file_name(r, from))) << r;
  resume_and_check(saved, to, master);
}

TEST(ShardedCheckpoint, Reshard2To3) { reshard(2, 3); }
TEST(ShardedCheckpoint, Reshard3To2) { reshard(3, 2); }
TEST(ShardedCheckpoint, Reshard4To1) { reshard(4, 1); }
TEST(ShardedCheckpoint, Reshard1To2) { reshard(1, 2); }
TEST(ShardedCheckpoint, Reshard2To3WithMasterWeights) { reshard(2, 3, /*master=*/true); }

TEST(ShardedCheckpoint, ShardedResumesUnshardedAtWorldOne) {
  test::TempDir dir("shard");
  const Saved saved = train_and_save(dir.path(), 2, false);
  auto model = make_model(1234);
  auto opt = make_step_optimizer(adamw(), OptimizerPlacement{}, trainable(*model), nullptr);
  const LoadedCheckpoint loaded = CheckpointStore::load(saved.path);
  EXPECT_TRUE(restore_state(loaded, *model, *opt, 0));
  expect_weights(*model, saved);
  torch::optim::Optimizer& libtorch = *opt->replicated();
  const Named params = trainable(*model);
  for (const auto& [name, p] : params) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(
        *libtorch.state().at(p.unsafeGetTensorImpl()));
    EXPECT_EQ(s.step(), saved.steps);
    EXPECT_TRUE(torch::equal(s.exp_avg(), saved.state.at("exp_avg").at(name))) << name;
    EXPECT_TRUE(torch::equal(s.exp_avg_sq(), saved.state.at("exp_avg_sq").at(name))) << name;
  }
  train(model, *opt, 0, 2, 1);
}

TEST(ShardedCheckpoint, UnshardedResumesShardedAtWorldTwo) {
  test::TempDir dir("shard");
  auto model = make_model(7);
  auto opt = make_step_optimizer(adamw(), OptimizerPlacement{}, trainable(*model), nullptr);
  std::string path;
  {
    RunConfig config;
    Reporter reporter(dir.path(), true, 0);
    Checkpointer checkpointer(config, {dir.path(), false, false}, reporter, nullptr);
    checkpointer.claim_directory();
    train(model, *opt, 0, 0, 2);
    checkpointer.save(meta_of(2, 1), *model, *opt);
    checkpointer.drain();
    path = checkpointer.last_checkpoint();
  }
  const CheckpointInfo info = CheckpointView::inspect(path, true);
  ASSERT_TRUE(info.complete) << info.problem;
  EXPECT_EQ(info.manifest["format_version"], kCheckpointFormatVersion);  // unsharded: still 2
  Saved saved;
  saved.path = path;
  saved.steps = 2;
  for (const auto& [name, t] : state_dict(*model)) saved.weights.emplace_back(name, t.clone());
  for (const auto& [name, p] : trainable(*model)) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(
        *opt->replicated()->state().at(p.unsafeGetTensorImpl()));
    saved.state["exp_avg"][name] = s.exp_avg().clone();
    saved.state["exp_avg_sq"][name] = s.exp_avg_sq().clone();
  }
  resume_and_check(saved, 2, false);
}

/// Flips one byte of `path` at `offset`.
void flip_byte(const std::string& path, int64_t offset) {
  std::string bytes = fs::read_file(path);
  bytes[static_cast<size_t>(offset)] ^= 0x20;
  fs::write_file(path, bytes);
}

TEST(ShardedCheckpoint, AFlippedByteOrAMissingShardIsDamageAndEveryRankTakesThePrevious) {
  test::TempDir dir("shard");
  const Saved saved = train_and_save(dir.path(), 2, false, /*saves=*/2);
  const std::string newest = saved.path;
  const std::string shard = newest + "/" + shard_file_name(1, 2);
  flip_byte(shard, 100);
  CheckpointInfo info = CheckpointView::inspect(newest, /*verify=*/true);
  EXPECT_FALSE(info.complete);
  EXPECT_NE(info.problem.find(shard_file_name(1, 2)), std::string::npos) << info.problem;
  // A process that reads it (sizes checked only) finds the damage as it reads its slice.
  {
    auto model = make_model(1);
    FlatOptimizer opt(adamw(), {}, trainable(*model), nullptr, 0, 1);
    const LoadedCheckpoint loaded{
        CheckpointView::inspect(newest, false), meta_from_manifest(info.manifest), {}};
    EXPECT_THROW(restore_state(loaded, *model, opt, 0), DamagedCheckpointError);
  }
  // Two ranks resuming: rank 0 verifies, sets the damaged one aside and names the previous one
  // to both.
  std::mutex mutex;
  std::vector<std::string> chosen;
  run_ranks(2, [&](int rank, Collectives* comm) {
    RunConfig config;
    Reporter reporter(dir.path(), rank == 0, rank);
    Checkpointer checkpointer(config, {dir.path(), true, true}, reporter, comm);
    checkpointer.claim_directory();
    const std::optional<LoadedCheckpoint> loaded = checkpointer.choose();
    const std::lock_guard<std::mutex> lock(mutex);
    chosen.push_back(loaded ? loaded->info.name : "none");
  });
  ASSERT_EQ(chosen.size(), 2u);
  EXPECT_EQ(chosen[0], checkpoint_name(0, 2));
  EXPECT_EQ(chosen[1], checkpoint_name(0, 2));
  EXPECT_TRUE(std::filesystem::exists(newest + ".damaged"));
  // A missing shard: the quick check of sizes already sets it aside.
  std::filesystem::remove(dir / (checkpoint_name(0, 2) + "/" + shard_file_name(0, 2)));
  info = CheckpointView::inspect(dir / checkpoint_name(0, 2), /*verify=*/false);
  EXPECT_FALSE(info.complete);
  EXPECT_NE(info.problem.find("missing"), std::string::npos) << info.problem;
}

TEST(ShardedCheckpoint, AManifestThatDisagreesWithItsShardsIsDamaged) {
  FlatLayout layout({{"w", {200}}, {"b", {3}}}, 2);
  json m;
  m["format_version"] = kShardedFormatVersion;
  m[kShardedOptimizerKey] =
      make_shard_index(layout, "adam", {"exp_avg", "exp_avg_sq"}, 4).to_json();
  const int64_t bytes = 2 * layout.shard_numel() * 4;
  m["files"] = {{shard_file_name(0, 2), {{"bytes", bytes}, {"xxh3", "0"}}},
                {shard_file_name(1, 2), {{"bytes", bytes}, {"xxh3", "0"}}}};
  EXPECT_EQ(check_sharded_manifest(m), "");
  json shorter = m;
  shorter["files"][shard_file_name(1, 2)]["bytes"] = 16;
  EXPECT_NE(check_sharded_manifest(shorter).find("reach past"), std::string::npos);
  json missing = m;
  missing["files"].erase(shard_file_name(0, 2));
  EXPECT_NE(check_sharded_manifest(missing).find("not in its files table"), std::string::npos);
  json gap = m;
  gap[kShardedOptimizerKey]["parameters"][0]["chunks"][0][2] = 10;  // [0, 10) then [192, 200)
  EXPECT_NE(check_sharded_manifest(gap).find("does not continue"), std::string::npos);
  json unlisted = m;
  unlisted.erase(kShardedOptimizerKey);
  EXPECT_NE(check_sharded_manifest(unlisted), "");
  EXPECT_EQ(ShardIndex::from_json(m[kShardedOptimizerKey]).to_json(), m[kShardedOptimizerKey]);
}

/// Saves `model` (fp32 weights, trainable) at step 0 as a one-process sharded checkpoint with
/// master weights (its model.pt in bf16, the fp32 master in the shard); returns its folder.
std::string save_master_checkpoint(const std::string& dir, torch::nn::Sequential& model,
                                   const OptimConfig& optim, int steps = 0,
                                   Named* master = nullptr) {
  FlatOptimizerOptions options;
  options.master_weights = true;
  FlatOptimizer opt(optim, options, trainable(*model), nullptr, 0, 1);
  train(model, opt, 0, 0, steps);
  if (master) {
    const at::Tensor flat = opt.state().back().second;  // "master", the last state
    for (const FlatParameter& p : opt.layout().parameters())
      master->emplace_back(p.name, flat.narrow(0, p.offset, p.numel).view(p.shape).clone());
  }
  RunConfig config;
  config.checkpoint.async = false;
  Reporter reporter(dir, true, 0);
  Checkpointer checkpointer(config, {dir, false, false}, reporter, nullptr);
  checkpointer.claim_directory();
  CheckpointMeta meta = meta_of(1, 1);
  meta.config["optim"]["name"] = optim.name;
  checkpointer.save(meta, *model, opt);
  checkpointer.drain();
  return checkpointer.last_checkpoint();
}

LoadedCheckpoint verified(const std::string& path) { return CheckpointStore::load(path); }

TEST(ShardedCheckpoint, ExportWritesTheFp32MasterAsAStateDictThatPythonLoadsStrictly) {
  test::TempDir dir("shard");
  auto model = make_model(7);
  Named fp32;
  const std::string path = save_master_checkpoint(dir.path(), model, adamw(), 2, &fp32);
  // model.pt holds bf16 weights; the export holds the fp32 master, bit for bit.
  const NamedTensors bf16 = load_model_tensors(verified(path));
  EXPECT_EQ(bf16.front().second.scalar_type(), at::kBFloat16);
  EXPECT_FALSE(torch::equal(bf16.front().second.to(at::kFloat), fp32.front().second));
  const std::string out = dir / "exported.pt";
  export_fp32_state_dict(verified(path), out);
  const NamedTensors exported = unpickle_tensors(fs::read_file(out), out);
  ASSERT_EQ(exported.size(), fp32.size());
  for (size_t i = 0; i < fp32.size(); ++i) {
    EXPECT_EQ(exported[i].first, fp32[i].first);
    EXPECT_TRUE(torch::equal(exported[i].second, fp32[i].second)) << fp32[i].first;
  }
  const std::string script = dir / "load.py";
  std::ofstream(script) << "import sys, torch\n"
                           "m = torch.nn.Sequential(torch.nn.Linear(20, 33), torch.nn.ReLU(), "
                           "torch.nn.Linear(33, 7))\n"
                           "sd = torch.load(sys.argv[1], weights_only=True)\n"
                           "assert all(t.dtype == torch.float32 for t in sd.values())\n"
                           "m.load_state_dict(sd, strict=True)\n"
                           "print('loaded', len(sd))\n";
  const std::string command = std::string(GPURUN_PYTHON) + " " + script + " " + out;
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

/// Resident bytes of this process now (/proc/self/statm).
int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

TEST(ShardedCheckpoint, ExportNeedsAtMostTheLargestTensorPlus64MiB) {
  test::TempDir dir("shard");
  // Ten 2048 x 2048 layers: 160 MiB of fp32 weights, the largest tensor 16 MiB.
  torch::manual_seed(3);
  torch::nn::Sequential model;
  for (int i = 0; i < 10; ++i) model->push_back(torch::nn::Linear(2048, 2048));
  OptimConfig sgd;
  sgd.name = "sgd";  // no momentum: the master is the whole shard
  const std::string path = save_master_checkpoint(dir.path(), model, sgd);
  const LoadedCheckpoint checkpoint = verified(path);
  const std::string out = dir / "exported.pt";
  // In a child, so that its peak resident size (wait4's ru_maxrss) is the export's alone,
  // over what the child inherited.
  const int64_t before = resident_bytes();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      export_fp32_state_dict(checkpoint, out);
      ::_exit(0);
    } catch (...) {
      ::_exit(1);
    }
  }
  int status = 0;
  rusage usage{};
  ASSERT_EQ(::wait4(child, &status, 0, &usage), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const int64_t peak = static_cast<int64_t>(usage.ru_maxrss) * 1024 - before;
  const int64_t largest = 2048 * 2048 * 4;
  EXPECT_LE(peak, largest + (64LL << 20)) << "the export's peak above its parent: " << peak;
  EXPECT_EQ(fs::file_size(out) / (1 << 20), 160);  // the whole model was written
}

/// Two saves of one process, the second killed by GPURUN_FAULT at `fault` (a death test in a
/// fresh process: the fault hooks read the environment once); then a resume takes `expect`.
void killed_save(const std::string& fault, int64_t expect) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The threadsafe style runs this test's body again in the child: it must write into the
  // parent's folder, not into one of its own.
  std::optional<test::TempDir> own;
  const char* inherited = std::getenv("GPURUN_TEST_SHARD_DIR");
  if (!inherited) own.emplace("shard");
  const std::string dir = inherited ? inherited : own->path();
  ::setenv("GPURUN_TEST_SHARD_DIR", dir.c_str(), 1);
  ::setenv("GPURUN_FAULT", fault.c_str(), 1);
  EXPECT_EXIT(
      {
        auto model = make_model(7);
        FlatOptimizerOptions options;
        options.master_weights = true;
        FlatOptimizer opt(adamw(), options, trainable(*model), nullptr, 0, 1);
        RunConfig config;
        Reporter reporter(dir, true, 0);
        Checkpointer checkpointer(config, {dir, false, false}, reporter, nullptr);
        checkpointer.claim_directory();
        for (int s = 1; s <= 2; ++s) {
          train(model, opt, 0, s, 1);
          checkpointer.save(meta_of(s, 1), *model, opt);
          checkpointer.drain();
        }
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "");
  ::unsetenv("GPURUN_FAULT");
  ::unsetenv("GPURUN_TEST_SHARD_DIR");
  CheckpointStore store(dir, 3);
  store.clean_temporaries();
  const std::optional<LoadedCheckpoint> loaded = store.load_latest(/*verify=*/true);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->meta.global_step, expect) << fault;
  auto model = make_model(1);
  FlatOptimizerOptions options;
  options.master_weights = true;
  FlatOptimizer opt(adamw(), options, trainable(*model), nullptr, 0, 1);
  EXPECT_TRUE(restore_state(*loaded, *model, opt, 0));
  EXPECT_EQ(opt.step_count(), expect);
}

TEST(ShardedCheckpointFaults, KilledDuringTheShardWriteResumesThePrevious) {
  killed_save("sigkill:shard_write:2", 1);
}
TEST(ShardedCheckpointFaults, KilledBeforeTheManifestResumesThePrevious) {
  killed_save("sigkill:before_manifest:2", 1);
}
TEST(ShardedCheckpointFaults, KilledBeforeLatestResumesTheNewComplete) {
  killed_save("sigkill:before_latest:2", 2);
}

}  // namespace
}  // namespace gpurun

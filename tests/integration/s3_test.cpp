// Checkpoints in an S3 bucket (`--ckpt s3://BUCKET/PREFIX`, issue 42) against a real S3 server:
// Ceph's RADOS Gateway, started once for these tests by ctest (scripts/s3-gateway.sh, the
// fixture in tests/CMakeLists.txt), each test in a bucket of its own. Independent checks go
// through boto3 (Debian's python3-boto3), faults through tests/tools/s3/fault_proxy.py.
// A fresh XDG_CACHE_HOME stands for a new instance: an empty local disk.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSystemPython = "/usr/bin/python3";

/// The gateway's settings (GPURUN_S3_GATEWAY_DIR/env), or empty when none runs.
Env gateway_env() {
  const char* dir = std::getenv("GPURUN_S3_GATEWAY_DIR");
  if (!dir && fs::exists(std::string(GPURUN_S3_GATEWAY_DIR) + "/env")) dir = GPURUN_S3_GATEWAY_DIR;
  if (!dir) return {};
  std::ifstream in(std::string(dir) + "/env");
  Env env;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("export ", 0) != 0) continue;
    const size_t eq = line.find('=');
    env[line.substr(7, eq - 7)] = line.substr(eq + 1);
  }
  return env;
}

std::string fresh_bucket() {
  std::random_device device;
  std::ostringstream name;
  name << "gpurun-" << std::hex << device() << device();
  return name.str();
}

/// Runs a boto3 snippet with the gateway's settings; `s3` is the client, `B` the bucket.
Result boto3(const Env& env, const std::string& bucket, const std::string& code) {
  std::vector<std::string> argv{"/usr/bin/env"};
  for (const auto& [k, v] : env) argv.push_back(k + "=" + v);
  argv.insert(argv.end(), {kSystemPython, "-c",
                           "import boto3, os, sys\n"
                           "s3 = boto3.client('s3', endpoint_url=os.environ['AWS_ENDPOINT_URL'])\n"
                           "B = '" +
                               bucket + "'\n" + code});
  return run_program(argv);
}

class S3 : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = gateway_env();
    if (env_.empty())
      GTEST_SKIP() << "no S3 gateway: " GPURUN_S3_GATEWAY_DIR
                      "/env is missing (ctest's fixture "
                      "S3Gateway.Start starts scripts/s3-gateway.sh there)";
    bucket_ = fresh_bucket();
    const Result made = boto3(env_, bucket_, "s3.create_bucket(Bucket=B)");
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }

  /// The settings of a gpurun on "a machine" whose local disk is `cache`.
  Env machine(const std::string& cache) const {
    Env env = env_;
    env["XDG_CACHE_HOME"] = cache;
    return env;
  }
  std::string url(const std::string& prefix) const { return "s3://" + bucket_ + "/" + prefix; }

  /// The object keys of the bucket, and the incomplete multipart uploads ("UPLOAD key").
  std::vector<std::string> keys() const {
    const Result r = boto3(env_, bucket_,
                           "for page in s3.get_paginator('list_objects_v2').paginate(Bucket=B):\n"
                           "  for o in page.get('Contents', []): print(o['Key'])\n"
                           "for u in s3.list_multipart_uploads(Bucket=B).get('Uploads', []):\n"
                           "  print('UPLOAD', u['Key'])\n");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> out;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) out.push_back(line);
    return out;
  }
  size_t uploads() const {
    size_t n = 0;
    for (const std::string& k : keys()) n += k.rfind("UPLOAD ", 0) == 0;
    return n;
  }

  nlohmann::json list_json(const std::string& root, const Env& env) const {
    const Result r = run_gpurun({"ckpt", "list", root, "--json"}, env);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out, nullptr, false);
  }
  std::string digest(const std::string& root, const Env& env) const {
    const Result r = run_gpurun({"ckpt", "inspect", root, "--json"}, env);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_object() ? j.value("model_digest", "") : "";
  }

  Env env_;
  std::string bucket_;
};

/// 2000 samples, batch 50: 40 steps an epoch, 2 epochs, a save every 10 steps. hidden 4096
/// makes model.pt and optim.pt about 13 MiB each: two 8 MiB parts, so uploads are multipart.
std::string config(const TempDir& dir, int hidden = 64, const std::string& extra = "") {
  return write_config(dir, "model: {name: mlp, hidden: [" + std::to_string(hidden) +
                               "]}\n"
                               "data: {name: idx, train_samples: 2000, eval_samples: 200}\n"
                               "optim: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                               "train: {epochs: 2, batch_size: 50, eval_batch_size: 200, seed: 7, "
                               "threads: 1}\n"
                               "checkpoint: {every_steps: 10, keep_last: 3}\n"
                               "memory: {probe_steps: 1}\n"
                               "log: {every_steps: 1}\n" +
                               extra);
}

std::string uninterrupted_digest(const TempDir& dir, const std::string& cfg,
                                 const std::vector<std::string>& more = {}) {
  std::vector<std::string> args{"--ckpt", dir / "reference", cfg};
  args.insert(args.end(), more.begin(), more.end());
  const Result r = run_gpurun(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return inspect(dir / "reference").value("model_digest", "");
}

// A run SIGKILLed after its first checkpoints reached the bucket resumes on another machine
// (an empty local disk) from the bucket, and ends at the uninterrupted run's digest.
TEST_F(S3, AKilledRunResumesOnAnEmptyLocalDiskToTheUninterruptedDigest) {
  TempDir dir;
  const std::string cfg = config(dir);
  const std::string want = uninterrupted_digest(dir, cfg);
  const std::string root = url("run1"), run_dir = dir / "run";
  const std::vector<std::string> args{"--resume", "--ckpt", root, "--run-dir", run_dir, cfg};
  Env first = machine(dir / "machine1");
  first["GPURUN_FAULT"] = "sleep20:after_step:*";
  const pid_t pid = start_gpurun(args, dir / "first", first);
  ASSERT_TRUE(wait_for_event(run_dir, "checkpoint_copied", {}, pid)) << slurp(dir / "first.err");
  ASSERT_TRUE(wait_for_step(run_dir, 45, pid)) << "the run ended before the kill";
  kill(pid, SIGKILL);
  EXPECT_EQ(wait_gpurun(pid, dir / "first").signal, SIGKILL);

  const Env second = machine(dir / "machine2");
  const Result resumed = run_gpurun(args, second);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, "fetching " + root + "/ckpt-")) << resumed.err;
  EXPECT_FALSE(contains(resumed.err, "starting a new run")) << resumed.err;
  EXPECT_EQ(digest(root, second), want);
  EXPECT_GT(expect_exact_resume_checks(run_dir), 0u);
  EXPECT_EQ(uploads(), 0u);
}

// The same for a run of 2 ranks whose optimizer state is sharded (each rank's shard file goes
// to the local tier, the folder to the bucket behind it).
TEST_F(S3, ASharded2RankRunKilledAndResumedOnAnEmptyDiskEndsAtTheUninterruptedDigest) {
  TempDir dir;
  const std::string cfg = config(dir, 96, "distributed: {shard: optimizer}\n");
  const std::vector<std::string> ranks{"--nproc-per-node", "2"};
  const std::string want = uninterrupted_digest(dir, cfg, ranks);
  const std::string root = url("sharded"), run_dir = dir / "run";
  std::vector<std::string> args{"--resume", "--ckpt", root, "--run-dir", run_dir, cfg};
  args.insert(args.end(), ranks.begin(), ranks.end());
  Env first = machine(dir / "machine1");
  first["GPURUN_FAULT"] = "sleep20:after_step:*";
  const pid_t pid = start_gpurun(args, dir / "first", first);
  ASSERT_TRUE(wait_for_event(run_dir, "checkpoint_copied", {}, pid)) << slurp(dir / "first.err");
  ASSERT_TRUE(wait_for_step(run_dir, 45, pid));
  kill(pid, SIGKILL);
  wait_gpurun(pid, dir / "first");

  const Env second = machine(dir / "machine2");
  const Result resumed = run_gpurun(args, second);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, "fetching " + root + "/ckpt-")) << resumed.err;
  EXPECT_EQ(digest(root, second), want);
  const auto manifest = nlohmann::json::parse(
      run_gpurun({"ckpt", "inspect", root, "--json"}, second).out, nullptr, false);
  EXPECT_TRUE(manifest.contains("sharded_optimizer")) << manifest.dump();
}

// A SIGKILL while the parts of a file are uploading, after every file but before the manifest,
// and after the manifest but before LATEST: each time a resume on an empty disk takes the
// newest complete checkpoint, no incomplete upload is left once it started, and the run ends at
// the uninterrupted digest.
TEST_F(S3, AKillAtEveryStageOfAnUploadLeavesNothingAResumeCouldTake) {
  TempDir dir;
  const std::string cfg = config(dir, 4096);
  const std::string want = uninterrupted_digest(dir, cfg);
  const std::string root = url("stages");
  const std::vector<std::string> args{
      "--resume", "--ckpt", root, "--set", "checkpoint.local_dir=none", cfg};
  int machine_number = 0;
  // s3_upload N: a kill once this process's uploads took in N x 8 MiB (a part is in flight).
  // The other two are the commit's moments of the store's protocol (util/faults.h).
  for (const std::string fault :
       {"sigkill:s3_upload:3", "sigkill:before_rename:2", "sigkill:before_latest:3"}) {
    SCOPED_TRACE(fault);
    Env env = machine(dir / ("machine" + std::to_string(++machine_number)));
    env["GPURUN_FAULT"] = fault;
    const Result killed = run_gpurun(args, env);
    ASSERT_EQ(killed.signal, SIGKILL) << killed.err;
    const auto listed = list_json(root, env);
    for (const auto& row : listed["checkpoints"])
      EXPECT_TRUE(row.value("complete", false)) << row.dump();
    if (machine_number == 1) {
      EXPECT_GE(uploads(), 1u) << "the kill came after the upload it was meant to cut";
    } else {
      // Started on a bucket holding the killed upload: aborted at the start.
      EXPECT_EQ(uploads(), 0u);
      if (machine_number == 2) {
        EXPECT_TRUE(contains(killed.err, "aborting the incomplete upload")) << killed.err;
      }
    }
  }
  const Env last = machine(dir / "last");
  const Result done = run_gpurun(args, last);
  ASSERT_EQ(done.exit_code, 0) << done.err;
  EXPECT_EQ(uploads(), 0u);
  EXPECT_EQ(digest(root, last), want);
}

// Through a proxy that answers 503 SlowDown to 3 parts, resets a connection mid-part and cuts
// a download short: the run and its resume go on (each retry logged), no checkpoint twice.
TEST_F(S3, SlowDownsResetsAndCutDownloadsAreRetriedAndTheDigestHolds) {
  TempDir dir;
  const std::string cfg = config(dir, 4096);
  const std::string want = uninterrupted_digest(dir, cfg);
  const std::string port_file = dir / "proxy.port";
  const pid_t proxy = start_program(
      {kSystemPython, std::string(GPURUN_SOURCE_DIR) + "/tests/tools/s3/fault_proxy.py",
       "--upstream", env_.at("AWS_ENDPOINT_URL"), "--port-file", port_file, "--slowdown-parts", "3",
       "--reset-parts", "1", "--cut-gets", "1", "--log", dir / "faults.jsonl"},
      dir / "proxy");
  for (int i = 0; i < 100 && trimmed(slurp(port_file)).empty(); ++i) sleep_for(0.1);
  ASSERT_FALSE(trimmed(slurp(port_file)).empty()) << slurp(dir / "proxy.err");
  Env env = machine(dir / "machine1");
  env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:" + trimmed(slurp(port_file));
  const std::string root = url("faults");
  const std::vector<std::string> args{
      "--resume", "--ckpt",         root, "--set", "checkpoint.local_dir=none",
      "--set",    "train.epochs=1", cfg};
  const Result first = run_gpurun(args, env);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // The rest of the run on another machine, from the bucket, through a download cut short.
  env["XDG_CACHE_HOME"] = dir / "machine2";
  std::vector<std::string> rest = args;
  rest[6] = "train.epochs=2";
  const Result second = run_gpurun(rest, env);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  kill(proxy, SIGTERM);
  wait_gpurun(proxy, dir / "proxy");
  const std::string faults = slurp(dir / "faults.jsonl");
  EXPECT_EQ(count_of(faults, "slowdown"), 3u) << faults;
  EXPECT_EQ(count_of(faults, "reset"), 1u) << faults;
  EXPECT_EQ(count_of(faults, "cut"), 1u) << faults;
  EXPECT_GE(count_of(first.err + second.err, "retrying"), 4u) << first.err << second.err;
  EXPECT_EQ(digest(root, machine(dir / "machine3")), want);
  // One folder per step: no retried upload left a second copy.
  std::vector<std::string> manifests;
  for (const std::string& key : keys())
    if (contains(key, "/manifest.json")) manifests.push_back(key);
  EXPECT_EQ(manifests.size(), 3u) << testing::PrintToString(manifests);
}

// A second gpurun on the same root while the first runs exits with the lease error; once the
// first is SIGKILLed its lease is stale (its process is gone) and a third takes over.
TEST_F(S3, ASecondRunOnTheSameRootMeetsTheLeaseAndTakesItOnceItIsStale) {
  TempDir dir;
  const std::string cfg = config(dir);
  const std::string root = url("lease"), run_dir = dir / "run";
  Env env = machine(dir / "machine1");
  env["GPURUN_FAULT"] = "sleep100:after_step:*";
  const std::vector<std::string> args{
      "--resume", "--ckpt", root, "--run-dir", run_dir, "--set", "checkpoint.lease_timeout=2", cfg};
  const pid_t first = start_gpurun(args, dir / "first", env);
  ASSERT_TRUE(wait_for_step(run_dir, 2, first));
  const Result second = run_gpurun(args, machine(dir / "machine2"));
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_TRUE(contains(second.err, "lease")) << second.err;
  kill(first, SIGKILL);
  wait_gpurun(first, dir / "first");
  const Result third = run_gpurun(args, machine(dir / "machine3"));
  EXPECT_EQ(third.exit_code, 0) << third.err;
}

// Wrong secret, a missing bucket, an endpoint that does not answer: exit 2 within 10 s, before
// any training, no object written, and no secret in any file of the run nor on stderr.
TEST_F(S3, BadSettingsExitTwoFastWithoutWritingAndNeverShowTheSecret) {
  TempDir dir;
  const std::string cfg = config(dir);
  const std::string secret = env_.at("AWS_SECRET_ACCESS_KEY");
  struct Case {
    std::string name, key, value, root;
  };
  const std::vector<Case> cases{
      {"wrong secret", "AWS_SECRET_ACCESS_KEY", (secret[0] == '0' ? "1" : "0") + secret.substr(1),
       url("bad")},
      {"missing bucket", "", "", "s3://no-such-bucket-" + bucket_ + "/bad"},
      {"dead endpoint", "AWS_ENDPOINT_URL", "http://127.0.0.1:9", url("bad")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Env env = machine(dir / "machine");
    if (!c.key.empty()) env[c.key] = c.value;
    const std::string run_dir = dir / ("run-" + std::to_string(c.name.size()));
    const Result r = run_gpurun({"--ckpt", c.root, "--run-dir", run_dir, cfg}, env, 60);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_LT(r.seconds, 10.0) << r.err;
    EXPECT_FALSE(contains(r.err, "epoch 1/")) << r.err;
    EXPECT_FALSE(contains(r.err, secret)) << "the secret is on stderr";
    if (c.key == "AWS_SECRET_ACCESS_KEY") {
      EXPECT_FALSE(contains(r.err, c.value)) << r.err;
    }
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(dir.path(), ec)) {
      if (!e.is_regular_file()) continue;
      EXPECT_FALSE(contains(slurp(e.path().string()), secret)) << e.path() << " holds the secret";
    }
  }
  EXPECT_TRUE(keys().empty()) << testing::PrintToString(keys());
}

// A flipped byte in an object: `ckpt verify` names it, and a resume on an empty disk sets that
// checkpoint aside in the bucket (a marker object) and takes the previous one.
TEST_F(S3, AFlippedByteIsFoundByVerifyAndAResumeTakesThePreviousCheckpoint) {
  TempDir dir;
  const std::string cfg = config(dir);
  const std::string want = uninterrupted_digest(dir, cfg);
  const std::string root = url("damage");
  const Env env = machine(dir / "machine1");
  const std::vector<std::string> args{"--resume", "--ckpt", root, "--set", "train.epochs=1", cfg};
  ASSERT_EQ(run_gpurun(args, env).exit_code, 0);
  const auto listed = list_json(root, env)["checkpoints"];
  ASSERT_GE(listed.size(), 2u);
  const std::string newest = listed.back().value("name", "");
  const Result flipped = boto3(env_, bucket_,
                               "k = 'damage/" + newest +
                                   "/model.pt'\n"
                                   "b = bytearray(s3.get_object(Bucket=B, Key=k)['Body'].read())\n"
                                   "b[len(b) // 2] ^= 0x5a\n"
                                   "s3.put_object(Bucket=B, Key=k, Body=bytes(b))\n");
  ASSERT_EQ(flipped.exit_code, 0) << flipped.err;
  const Result verify = run_gpurun({"ckpt", "verify", root}, env);
  EXPECT_NE(verify.exit_code, 0) << verify.out;
  EXPECT_TRUE(contains(verify.out + verify.err, "model.pt")) << verify.out << verify.err;

  std::vector<std::string> rest = args;
  rest[4] = "train.epochs=2";
  const Env other = machine(dir / "machine2");
  const Result resumed = run_gpurun(rest, other);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  // Set aside with a marker (S3 has no rename); the resumed run's own save of that step then
  // replaces the damaged objects, and the marker with them.
  EXPECT_TRUE(contains(resumed.err, "set aside as " + newest + ".damaged")) << resumed.err;
  EXPECT_EQ(digest(root, other), want);
  EXPECT_EQ(run_gpurun({"ckpt", "verify", root}, other).exit_code, 0);
}

// keep_last 2 on the bucket: after a run of 8 saves exactly 2 complete checkpoints are there,
// the newest among them (the one a resume takes), and nothing else of the deleted ones.
TEST_F(S3, RetentionLeavesExactlyKeepLastCompleteCheckpointsInTheBucket) {
  TempDir dir;
  const std::string cfg = config(dir);
  const std::string root = url("retention");
  const Env env = machine(dir / "machine1");
  const Result r = run_gpurun({"--ckpt", root, "--set", "checkpoint.keep_last=2", cfg}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto listed = list_json(root, env);
  ASSERT_EQ(listed["checkpoints"].size(), 2u) << listed.dump();
  EXPECT_EQ(listed["checkpoints"].back().value("global_step", 0), 80);
  size_t folders = 0;
  for (const std::string& key : keys()) folders += contains(key, "/manifest.json");
  EXPECT_EQ(folders, 2u) << testing::PrintToString(keys());
}

// data.path in a bucket: its objects are staged to the local disk (data.stage_dir, by default
// the cache folder) and the run trains exactly what it trains on the local files; a second start
// reuses the staged copies (same size, ETag and xxh3) and downloads nothing.
TEST_F(S3, DataInABucketIsStagedTrainsAsTheLocalFilesAndIsReusedUnchanged) {
  TempDir dir;
  const std::string local = "/usr/share/datasets/fashion-mnist";
  const Result put = boto3(env_, bucket_,
                           "import glob\n"
                           "for f in glob.glob('" +
                               local +
                               "/*'):\n"
                               "  s3.upload_file(f, B, 'fmnist/' + os.path.basename(f))\n");
  ASSERT_EQ(put.exit_code, 0) << put.err;
  const std::string cfg = config(dir);
  const std::string want =
      uninterrupted_digest(dir, cfg, {"--set", "data.path=" + local, "--set", "train.epochs=1"});
  const Env env = machine(dir / "machine1");
  const std::vector<std::string> args{
      "--ckpt", dir / "run", "--set", "data.path=" + url("fmnist"), "--set", "train.epochs=1", cfg};
  const Result first = run_gpurun(args, env);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_TRUE(contains(first.err, "staged data.path " + url("fmnist"))) << first.err;
  EXPECT_EQ(inspect(dir / "run").value("model_digest", ""), want);
  const Result again = run_gpurun({"--ckpt", dir / "run2", "--set", "data.path=" + url("fmnist"),
                                   "--set", "train.epochs=1", cfg},
                                  env);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(contains(again.err, "every file unchanged, reused")) << again.err;
}

}  // namespace
}  // namespace gpurun::test

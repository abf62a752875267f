// The clouds' preemption notices (issue 43, part 2), end to end: gpurun pointed at a loopback
// metadata service of the test's own (tests/tools/cloud/metadata_server.py, AWS's IMDSv2, GCP's
// metadata server and Azure's IMDS, each insisting on its token or header) through the clouds'
// endpoint variables, and made to be on each cloud by a DMI folder of the test's
// (GPURUN_DMI_DIR). The server raises the notice once the run has logged a step.
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "integration/harness.h"
#include "util/clock.h"

namespace gpurun::test {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSystemPython = "/usr/bin/python3";
constexpr double kPollSeconds = 0.2;
constexpr const char* kPreemptId = "C7061BAC-AFDC-4513-B24B-AA5F13A16123";  // the server's

struct CloudCase {
  std::string name;                        ///< preemption.watch's word
  std::string vendor, product, asset_tag;  ///< its DMI strings
  std::string path_prefix;                 ///< of its requests
  std::string kind;                        ///< the notice's kind the server raises
  double seconds_left;  ///< from the notice to its deadline, as the server gives it
};

const std::vector<CloudCase>& clouds() {
  static const std::vector<CloudCase> kClouds = {
      {"aws", "Amazon EC2", "m5.large", "", "/latest/", "terminate", 120},
      {"gcp", "Google", "Google Compute Engine", "", "/computeMetadata/", "preempted", 30},
      {"azure", "Microsoft Corporation", "Virtual Machine", "7783-7084-3265-9085-8269-3286-77",
       "/metadata/", "Preempt", 30}};
  return kClouds;
}

std::string cloud_name(const testing::TestParamInfo<CloudCase>& info) { return info.param.name; }

/// gtest (and ctest's test names) print a case as its cloud, not as its bytes.
void PrintTo(const CloudCase& c, std::ostream* out) { *out << c.name; }

/// A folder of DMI files, as /sys/class/dmi/id holds them.
std::string write_dmi(const std::string& dir, const std::string& vendor, const std::string& product,
                      const std::string& asset_tag) {
  fs::create_directories(dir);
  std::ofstream(dir + "/sys_vendor") << vendor << "\n";
  std::ofstream(dir + "/product_name") << product << "\n";
  std::ofstream(dir + "/chassis_asset_tag") << asset_tag << "\n";
  return dir;
}

/// tests/tools/cloud/metadata_server.py on a free port, stopped by the destructor.
class MetadataServer {
 public:
  MetadataServer(const TempDir& dir, const std::vector<std::string>& flags)
      : log_(dir / "metadata.jsonl"), notice_(dir / "notice"), prefix_(dir / "metadata") {
    std::vector<std::string> argv{
        kSystemPython,   std::string(GPURUN_SOURCE_DIR) + "/tests/tools/cloud/metadata_server.py",
        "--port-file",   dir / "metadata.port",
        "--log",         log_,
        "--notice-file", notice_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    pid_ = start_program(argv, prefix_);
    for (int i = 0; i < 200 && trimmed(slurp(dir / "metadata.port")).empty(); ++i) sleep_for(0.05);
    host_ = "127.0.0.1:" + trimmed(slurp(dir / "metadata.port"));
  }
  ~MetadataServer() {
    kill(pid_, SIGTERM);
    wait_gpurun(pid_, prefix_, 30);
  }
  bool ok() const { return host_ != "127.0.0.1:"; }
  std::string why_not() const { return slurp(prefix_ + ".err"); }

  /// The environment that points gpurun at this server as the machine's cloud `c`.
  Env env_for(const CloudCase& c, const std::string& dmi_dir) const {
    return {{"GPURUN_DMI_DIR", write_dmi(dmi_dir, c.vendor, c.product, c.asset_tag)},
            {"AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://" + host_},
            {"GCE_METADATA_HOST", host_},
            {"GPURUN_AZURE_METADATA_ENDPOINT", "http://" + host_ + "/"}};
  }

  void raise_notice() const { std::ofstream(notice_) << "up\n"; }
  void end_notice() const { fs::remove(notice_); }

  /// Its log: one JSON object per request it answered, and one when it starts holding one.
  std::vector<nlohmann::json> requests() const {
    std::vector<nlohmann::json> out;
    std::istringstream lines(slurp(log_));
    for (std::string line; std::getline(lines, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded()) out.push_back(j);
    }
    return out;
  }

 private:
  std::string log_, notice_, prefix_, host_;
  pid_t pid_ = -1;
};

std::vector<std::string> run_sets(const TempDir& dir) {
  return {"preemption.poll_seconds=" + std::to_string(kPollSeconds),
          "checkpoint.local_dir=" + dir / "local"};
}

/// 2 epochs of 60 steps, saved at each epoch's end only: a notice's checkpoint is its own.
std::string write_run_config(const TempDir& dir) {
  return write_config(dir, small_config(1200, 20, 2));
}

/// The final model_digest of the run without any notice (computed once).
const std::string& uninterrupted_digest() {
  static const std::string digest = [] {
    TempDir dir;
    std::vector<std::string> args =
        with_sets({write_run_config(dir), "--ckpt", dir / "ckpt"}, run_sets(dir));
    args.insert(args.end(), {"--set", "preemption.watch=none"});
    const Result r = run_gpurun(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return inspect(dir / "ckpt").value("model_digest", "");
  }();
  return digest;
}

/// Each "preemption notices:" line of `err` at most once: a failure that repeats at every
/// poll is logged once. Returns those lines.
std::vector<std::string> notice_lines_once_each(const std::string& err) {
  std::vector<std::string> lines;
  std::set<std::string> seen;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    if (!contains(line, "preemption notices:")) continue;
    EXPECT_TRUE(seen.insert(line).second) << "logged twice: " << line;
    lines.push_back(line);
  }
  return lines;
}

class CloudNotice : public testing::TestWithParam<CloudCase> {};

// The notice mid-epoch: a complete checkpoint of the step reached within the poll interval and
// the save (and the copy to the network tier), exit 75, a `signal` event naming the notice; the
// resume on "another machine" ends at the uninterrupted run's digest. Azure's event is
// acknowledged once the checkpoint is safe. The server's AWS tokens live 1 s, so that gpurun
// fetches new ones after a 401, and its other events (a reboot 7 days ahead, another machine's,
// a freeze, a live migration) stop nothing.
TEST_P(CloudNotice, SavesAtOnceExits75AndTheResumeIsExact) {
  const CloudCase& c = GetParam();
  const std::string want = uninterrupted_digest();
  ASSERT_EQ(want.size(), 16u);
  TempDir dir;
  MetadataServer server(dir, {"--aws-token-seconds", "1"});
  ASSERT_TRUE(server.ok()) << server.why_not();
  const std::string ckpt = dir / "ckpt";
  const std::vector<std::string> args =
      with_sets({write_run_config(dir), "--ckpt", ckpt, "--resume"}, run_sets(dir));
  Env env = server.env_for(c, dir / "dmi");
  // 12 s of steps: the notice comes mid-epoch, however slow the machine's polls.
  env["GPURUN_FAULT"] = "sleep100:after_step:*";
  const pid_t pid = start_gpurun(args, dir / "run", env);
  ASSERT_TRUE(wait_for_step(ckpt, 10, pid)) << slurp(dir / "run.err");
  const double raised = unix_seconds();
  server.raise_notice();
  const Result stopped = wait_gpurun(pid, dir / "run", 120);
  ASSERT_EQ(stopped.exit_code, 75) << stopped.err;
  EXPECT_TRUE(contains(stopped.err, "preemption notice: " + c.name)) << stopped.err;
  EXPECT_FALSE(contains(stopped.err, "refused")) << stopped.err;
  notice_lines_once_each(stopped.err);

  const std::vector<nlohmann::json> signals = events(ckpt, "signal");
  ASSERT_EQ(signals.size(), 1u) << slurp(ckpt + "/metrics.jsonl");
  const nlohmann::json& notice = signals[0]["notice"];
  EXPECT_EQ(notice.value("cloud", ""), c.name);
  EXPECT_EQ(notice.value("kind", ""), c.kind);
  EXPECT_EQ(notice.value("deadline", "").size(), 20u) << notice;  // 2026-03-01T12:02:05Z
  EXPECT_NEAR(notice.value("seconds_left", 0.0), c.seconds_left, 3) << notice;
  ASSERT_TRUE(signals[0]["safe_seconds"].is_number()) << signals[0];
  const int64_t step = signals[0].value("global_step", int64_t{-1});
  EXPECT_GE(step, 10);
  EXPECT_LT(step, 120);

  // Its checkpoint: saved for the stop, within the poll and the save (generously: a loaded
  // machine), and complete in the network tier (--ckpt) before the exit.
  bool found = false;
  for (const nlohmann::json& e : events(ckpt, "checkpoint")) {
    if (e.value("global_step", int64_t{-1}) != step) continue;
    found = true;
    const double save = e.value("stall_seconds", 0.0) + e.value("write_seconds", 0.0);
    EXPECT_LT(e.value("time", 0.0) - raised, kPollSeconds + save + 20) << e;
  }
  EXPECT_TRUE(found) << "no checkpoint event of global step " << step;
  EXPECT_LT(signals[0]["safe_seconds"].get<double>(), 30);
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "-s%07lld", static_cast<long long>(step));
  bool in_network_tier = false;
  for (const auto& entry : fs::directory_iterator(ckpt)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && name.size() > 12 &&
        name.compare(name.size() - 9, 9, suffix) == 0)
      in_network_tier = fs::exists(entry.path() / "manifest.json");
  }
  EXPECT_TRUE(in_network_tier) << "no checkpoint of global step " << step << " in " << ckpt;

  // Only this cloud's service was asked.
  const std::vector<nlohmann::json> requests = server.requests();
  ASSERT_FALSE(requests.empty());
  for (const nlohmann::json& r : requests)
    EXPECT_EQ(r.value("path", "").rfind(c.path_prefix, 0), 0u) << r;
  if (c.name == "azure") {
    bool acknowledged = false;
    for (const nlohmann::json& r : requests)
      if (r.value("method", "") == "POST" && r.contains("acknowledged"))
        acknowledged = r["acknowledged"] == nlohmann::json::array({kPreemptId});
    EXPECT_TRUE(acknowledged) << "no StartRequests with the Preempt event's id";
  }

  // The resume, on a machine without a notice.
  server.end_notice();
  env.erase("GPURUN_FAULT");
  const Result resumed = run_gpurun(args, env);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(inspect(ckpt).value("model_digest", ""), want);
}

// A service that refuses gpurun's token or header (AWS: 401 for every token; GCP 403 and Azure
// 400, as theirs answer a request without their header): no notice is ever read, training
// ends normally, and the refusal is logged once per request, not at every poll.
TEST_P(CloudNotice, ARefusingServiceIsLoggedOnceAndTrainingFinishes) {
  const CloudCase& c = GetParam();
  TempDir dir;
  MetadataServer server(dir, {"--refuse"});
  ASSERT_TRUE(server.ok()) << server.why_not();
  server.raise_notice();  // up, but never read past the refusal
  Env env = server.env_for(c, dir / "dmi");
  env["GPURUN_FAULT"] = "sleep20:after_step:*";
  const Result r =
      run_gpurun(with_sets({write_run_config(dir), "--ckpt", dir / "ckpt"}, run_sets(dir)), env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(events(dir / "ckpt", "signal").empty());
  size_t refused = 0;
  for (const nlohmann::json& q : server.requests())
    if (q.value("status", 0) >= 400) ++refused;
  EXPECT_GE(refused, 6u) << "too few polls to see a repetition";
  size_t logged = 0;
  for (const std::string& line : notice_lines_once_each(r.err))
    if (contains(line, "refused with HTTP")) ++logged;
  EXPECT_GE(logged, 1u) << r.err;
  EXPECT_LE(logged, 2u) << r.err;  // one line per request path
}

// 500s, answers no protocol reads, and a request held 20 s: training finishes (exit 0), each
// kind of failure logged once, and the run's end does not wait for the held request.
TEST_P(CloudNotice, ServerErrorsGarbageAndAHangNeverStopTraining) {
  const CloudCase& c = GetParam();
  TempDir dir;
  MetadataServer server(dir, {"--faults", "ok,500,garbage,ok,hang", "--hang-seconds", "20"});
  ASSERT_TRUE(server.ok()) << server.why_not();
  Env env = server.env_for(c, dir / "dmi");
  env["GPURUN_FAULT"] = "sleep50:after_step:*";
  const Result r =
      run_gpurun(with_sets({write_run_config(dir), "--ckpt", dir / "ckpt"}, run_sets(dir)), env);
  const double ended = unix_seconds();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(events(dir / "ckpt", "signal").empty());
  const std::vector<std::string> lines = notice_lines_once_each(r.err);
  const auto logged = [&](const std::string& part) {
    for (const std::string& line : lines)
      if (contains(line, part)) return true;
    return false;
  };
  EXPECT_TRUE(logged("HTTP 500")) << r.err;
  EXPECT_TRUE(logged("not the protocol's")) << r.err;
  // A held request times out after at most 4 s (GCP's wait of 1 s, plus 3): its line is due
  // when the run outlived the first hang by more, as it does unless the machine is very slow.
  double first_hang = 0;
  for (const nlohmann::json& q : server.requests())
    if (q.value("fault", "") == "hang" && first_hang == 0) first_hang = q.value("time", 0.0);
  ASSERT_GT(first_hang, 0) << "the server held no request";
  if (ended - first_hang > 6) {
    EXPECT_TRUE(logged("no answer in time")) << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Clouds, CloudNotice, testing::ValuesIn(clouds()), cloud_name);

// preemption.watch auto on a machine whose DMI names no cloud: not one request, whatever the
// endpoint variables say.
TEST(CloudNoticeOffCloud, AutoOffACloudSendsNoRequest) {
  TempDir dir;
  MetadataServer server(dir, {});
  ASSERT_TRUE(server.ok()) << server.why_not();
  server.raise_notice();
  Env env = server.env_for({"qemu", "QEMU", "Standard PC (Q35 + ICH9, 2009)", "", "", "", 0},
                           dir / "dmi");
  const Result r =
      run_gpurun(with_sets({write_run_config(dir), "--ckpt", dir / "ckpt"}, run_sets(dir)), env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "preemption notices: not watched")) << r.err;
  EXPECT_EQ(server.requests().size(), 0u);
}

}  // namespace
}  // namespace gpurun::test

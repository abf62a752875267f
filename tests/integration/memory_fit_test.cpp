// Fitting the run to the device (issue 3) with the real binary: --memory-limit on CPU is
// enforced by the counting allocator, so these runs really allocate under the limit.
#include <algorithm>
#include <chrono>
#include <cmath>

#include <gtest/gtest.h>

#include "integration/harness.h"

namespace gpurun::test {
namespace {

/// `gpurun plan --json` for `config` with `sets`.
nlohmann::json plan_json(const std::string& config, const std::vector<std::string>& sets,
                         const std::string& limit = "") {
  std::vector<std::string> args{"plan", config, "--json"};
  if (!limit.empty()) args.insert(args.end(), {"--memory-limit", limit});
  Result r = run_gpurun(with_sets(args, sets));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_TRUE(j.is_object()) << r.out;
  return j;
}

std::vector<double> learning_rates(const std::string& run_dir) {
  std::vector<double> out;
  for (const auto& e : events(run_dir, "step")) out.push_back(e["lr"].get<double>());
  return out;
}

const char* kCnn =
    "model: {name: cnn, channels: [8, 16]}\n"
    "data: {name: idx, train_samples: 2560, eval_samples: 1000}\n"
    "optim: {name: adam, lr: 0.002}\n"
    "train: {epochs: 2, batch_size: 128, eval_batch_size: 250, seed: 5, threads: 1}\n"
    "log: {every_steps: 1}\n";

TEST(MemoryFit, RunUnderALimitBelowTheConfiguredPeakFitsAndLearnsTheSame) {
  TempDir dir;
  const std::string config = write_config(dir, kCnn);
  const nlohmann::json unlimited = plan_json(config, {});
  // Below the training steps' peak, so that the plan must change how it trains (evaluation,
  // the largest part here, shrinks its batch on its own).
  const int64_t peak = unlimited["measured_peaks"]["training"];
  ASSERT_GT(peak, 0);
  EXPECT_EQ(unlimited["accumulation_steps"], 1);
  const int64_t limit = peak * 6 / 10;

  Result free_run = run_gpurun({config, "--ckpt", dir / "free"});
  ASSERT_EQ(free_run.exit_code, 0) << free_run.err;
  Result limited =
      run_gpurun({config, "--ckpt", dir / "limited", "--memory-limit", std::to_string(limit)});
  ASSERT_EQ(limited.exit_code, 0) << limited.err;

  const auto plans = events(dir / "limited", "plan");
  ASSERT_EQ(plans.size(), 1u);
  const auto& plan = plans[0];
  EXPECT_LE(plan["measured_peak_bytes"].get<int64_t>(), limit);
  EXPECT_EQ(plan["capacity_bytes"], limit);
  EXPECT_TRUE(plan["accumulation_steps"].get<int64_t>() > 1 ||
              plan["activation_checkpointing"].get<bool>())
      << plan.dump();
  EXPECT_EQ(plan["micro_batch"].get<int64_t>() * plan["accumulation_steps"].get<int64_t>(), 128);

  const auto free_epochs = events(dir / "free", "epoch");
  const auto limited_epochs = events(dir / "limited", "epoch");
  ASSERT_EQ(limited_epochs.size(), 2u);
  EXPECT_NEAR(limited_epochs.back()["eval_accuracy"].get<double>(),
              free_epochs.back()["eval_accuracy"].get<double>(), 0.02);
  // The planner's predicted peak is within 15% of the peak measured during training. The run
  // reaches it once its checkpoint copy is held between saves (the plan counts it in training
  // and evaluation), so after the first save: the run's peak is the largest epoch's.
  double run_peak = 0;
  for (const auto& e : limited_epochs) {
    const double trained = e["peak_bytes"].get<double>();
    EXPECT_LE(trained, static_cast<double>(limit));
    run_peak = std::max(run_peak, trained);
  }
  EXPECT_LT(std::abs(plan["measured_peak_bytes"].get<double>() - run_peak) / run_peak, 0.15)
      << "plan " << plan["measured_peak_bytes"] << " vs training " << run_peak;
}

// Case 3: 40 micro-batches, accumulation 4, 10-step warm-up: 10 scheduler steps, each LR equal
// to a run with a 4x micro-batch; the same when the accumulation came from the planner.
TEST(Cases, SchedulerStepsOncePerOptimizerStep) {
  TempDir dir;
  const std::string config =
      write_config(dir,
                   "model: {name: cnn, channels: [8]}\n"
                   "data: {name: idx, train_samples: 320, eval_samples: 100}\n"
                   "optim: {name: sgd, lr: 0.1}\n"
                   "schedule: {name: cosine, warmup_steps: 10}\n"
                   "train: {epochs: 1, batch_size: 32, eval_batch_size: 100, threads: 1}\n"
                   "log: {every_steps: 1}\n");
  Result accumulated =
      run_gpurun({config, "--ckpt", dir / "a", "--set", "train.accumulation_steps=4"});
  ASSERT_EQ(accumulated.exit_code, 0) << accumulated.err;
  Result plain = run_gpurun({config, "--ckpt", dir / "b"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::vector<double> lr = learning_rates(dir / "a");
  ASSERT_EQ(lr.size(), 10u);
  EXPECT_EQ(lr, learning_rates(dir / "b"));
  EXPECT_DOUBLE_EQ(lr[0], 0.01);  // warm-up: one tenth per optimizer step
  EXPECT_DOUBLE_EQ(lr[9], 0.1);
  EXPECT_EQ(events(dir / "a", "plan")[0]["accumulation_steps"], 4);

  // Accumulation chosen by the planner: a limit between micro-batch 8's peak and 32's.
  // The training steps' part: evaluation, which the limit shrinks on its own, is larger here.
  const int64_t p32 = plan_json(config, {})["measured_peaks"]["training"];
  const int64_t p8 =
      plan_json(config, {"train.accumulation_steps=4"})["measured_peaks"]["training"];
  ASSERT_LT(p8, p32);
  const int64_t limit = static_cast<int64_t>((p8 + (p32 - p8) / 4) / 0.9);
  Result planned = run_gpurun({config, "--ckpt", dir / "c", "--memory-limit", std::to_string(limit),
                               "--set", "memory.strategy=accumulate"});
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  EXPECT_GT(events(dir / "c", "plan")[0]["accumulation_steps"].get<int64_t>(), 1);
  EXPECT_EQ(learning_rates(dir / "c"), lr);
}

// Case 8: resuming loads state to host first; the peak while loading stays within a fresh
// run's training peak plus a small margin.
TEST(Cases, ResumePeakIsNoHigherThanAFreshRunsPeak) {
  TempDir dir;
  const std::string config = write_config(dir, kCnn);
  Result killed = run_gpurun({config, "--ckpt", dir / "ckpt", "--set", "checkpoint.every_steps=5"},
                             {{"GPURUN_FAULT", "sigkill:after_step:12"}});
  ASSERT_EQ(killed.signal, 9) << killed.err;
  Result resumed =
      run_gpurun({config, "--ckpt", dir / "ckpt", "--resume", "--set", "checkpoint.every_steps=5"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto plan = events(dir / "ckpt", "plan");
  const auto resume = events(dir / "ckpt", "resume");
  ASSERT_EQ(resume.size(), 1u);
  const int64_t fresh_peak = plan.front()["measured_peak_bytes"];
  EXPECT_LE(resume[0]["peak_bytes"].get<int64_t>(), fresh_peak + (int64_t{256} << 10))
      << "resume peak " << resume[0]["peak_bytes"] << " vs fresh " << fresh_peak;
  // The plan probed this resume's loading with the code the resume ran.
  const double probed = plan.front()["measured_peaks"]["resume_loading"];
  EXPECT_LT(std::abs(resume[0]["peak_bytes"].get<double>() - probed) / probed, 0.15)
      << "resume peak " << resume[0]["peak_bytes"] << " vs probed " << probed;
}

// Case 9: memory that fits training micro-batch 8 but not eval batch 2048: only the eval batch
// shrinks, and micro x accumulation x world stays the configured global batch.
TEST(Cases, EvalOutOfMemoryShrinksOnlyTheEvalBatch) {
  TempDir dir;
  const std::string config =
      write_config(dir,
                   "model: {name: cnn, channels: [16]}\n"
                   "data: {name: idx, train_samples: 64, eval_samples: 2048}\n"
                   "train: {epochs: 1, batch_size: 8, eval_batch_size: 2048, threads: 1}\n");
  const int64_t train_peak = plan_json(config, {"train.eval_batch_size=8"})["measured_peak_bytes"];
  const std::string limit = std::to_string(train_peak * 3);
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt", "--memory-limit", limit});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto plan = events(dir / "ckpt", "plan").at(0);
  EXPECT_EQ(plan["micro_batch"], 8);
  EXPECT_EQ(plan["accumulation_steps"], 1);
  EXPECT_EQ(plan["global_batch"], 8);
  EXPECT_LT(plan["eval_batch"].get<int64_t>(), 2048);
  EXPECT_EQ(events(dir / "ckpt", "epoch").size(), 1u);
}

TEST(MemoryFit, NothingFitsExits2WithNeedCapacityAndACard) {
  TempDir dir;
  const std::string config = write_config(dir, kCnn);
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt", "--memory-limit", "64KiB"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("bytes"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("65536"), std::string::npos) << r.err;
  // The smallest card of the bundled table (examples/cards.yaml).
  EXPECT_NE(r.err.find("the smallest card that fits: NVIDIA L4"), std::string::npos) << r.err;
}

TEST(MemoryFit, PlanPrintsMeasuredEstimateAndCards) {
  TempDir dir;
  const std::string config = write_config(dir, kCnn);
  const nlohmann::json j = plan_json(config, {});
  for (const char* key :
       {"measured_peak_bytes", "estimated_peak_bytes", "capacity_bytes", "micro_batch",
        "accumulation_steps", "activation_checkpointing", "global_batch", "eval_batch",
        "world_size", "breakdown", "cards", "eta_seconds"})
    EXPECT_TRUE(j.contains(key)) << key;
  // The bundled table (examples/cards.yaml): this small CNN fits every card as configured,
  // and each forecast is consistent: hours = step x steps, cost = hours x price.
  ASSERT_EQ(j["cards"].size(), 9u);
  for (const auto& card : j["cards"]) {
    EXPECT_EQ(card["fits"], "as_configured") << card.dump();
    ASSERT_TRUE(card["predicted_step_seconds"].is_number()) << card.dump();
    EXPECT_GT(card["predicted_step_seconds"].get<double>(), 0);
    EXPECT_NEAR(
        card["hours_to_finish"].get<double>(),
        card["predicted_step_seconds"].get<double>() * j["total_steps"].get<double>() / 3600.0,
        1e-9);
    EXPECT_TRUE(card["cost_to_finish"].is_number()) << card.dump();
    EXPECT_TRUE(card["cards_for_deadline"].is_null()) << card.dump();
  }
  // Every part of the run is measured; the plan's peak is the largest, training and
  // evaluation counting the checkpoint copy a CPU run keeps between saves (when it fits, as
  // here: nothing limits this run's memory).
  const nlohmann::json& peaks = j["measured_peaks"];
  const int64_t buffers = peaks.value("checkpoint_buffers", int64_t{0});
  EXPECT_GT(buffers, 0) << j.dump();
  const auto in_run = [&](const std::string& part) {
    const bool between_saves = part == "training" || part == "evaluation";
    return peaks[part].get<int64_t>() + (between_saves ? buffers : 0);
  };
  int64_t largest = 0;
  for (const char* part : {"training", "evaluation", "checkpoint_capture", "resume_loading"}) {
    ASSERT_TRUE(peaks.contains(part)) << part << " in " << j.dump();
    EXPECT_GT(peaks[part].get<int64_t>(), 0) << part;
    largest = std::max(largest, in_run(part));
  }
  EXPECT_EQ(j["measured_peak_bytes"], largest);
  EXPECT_EQ(in_run(j["peak_part"].get<std::string>()), largest);
  // The estimate models a training step.
  const double measured = j["measured_peaks"]["training"], estimated = j["estimated_peak_bytes"];
  EXPECT_LT(std::abs(estimated - measured) / measured, 0.5) << j.dump();

  Result text = run_gpurun({"plan", config});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const char* line : {"the largest of:", "training ", "evaluation ", "ckpt capture ",
                           "resume load ", "+ ckpt copy ", "kept between saves"})
    EXPECT_TRUE(contains(text.out, line)) << line << " in\n" << text.out;
}

// A limit just above what every part of the run needs fits as configured: the probes' own
// copies (of a model whose weights are a quarter of the need) take no room under the limit.
// A global batch beyond the training set is one step of the whole set an epoch: the probe must
// measure what a step can hold (the set), not allocate the configured batch (which here would
// need about 3 GB of input alone and, larger still, ran the machine out of memory).
TEST(MemoryFit, BatchLargerThanTheTrainingSetIsProbedAtTheSetsSize) {
  TempDir dir;
  const std::string config = write_config(dir, kCnn);
  const std::vector<std::string> small{"data.train_samples=256", "data.eval_samples=256"};
  std::vector<std::string> huge = small;
  huge.push_back("train.batch_size=1000000");
  std::vector<std::string> whole = small;
  whole.push_back("train.batch_size=256");
  const nlohmann::json a = plan_json(config, huge), b = plan_json(config, whole);
  ASSERT_TRUE(a.contains("measured_peaks") && b.contains("measured_peaks")) << a.dump();
  EXPECT_EQ(a["global_batch"], 1000000);
  EXPECT_EQ(a["measured_peaks"]["training"], b["measured_peaks"]["training"])
      << "a step of the whole 256-sample set, probed the same whatever the configured batch";
}

TEST(MemoryFit, ALimitJustAboveTheMeasuredPeakFitsAsConfigured) {
  TempDir dir;
  const std::string config =
      write_config(dir,
                   "model: {name: mlp, hidden: [2048, 2048]}\n"
                   "data: {name: idx, train_samples: 256, eval_samples: 100}\n"
                   "optim: {name: sgd, lr: 0.01, momentum: 0.9}\n"
                   "train: {epochs: 1, batch_size: 64, eval_batch_size: 100, threads: 1}\n");
  const nlohmann::json free_plan = plan_json(config, {});
  const double peak = free_plan["measured_peak_bytes"];
  const std::string limit = std::to_string(static_cast<int64_t>(peak / 0.9 * 1.02));
  const nlohmann::json limited = plan_json(config, {}, limit);
  EXPECT_EQ(limited["reason"], "fits as configured") << limited.dump();
  EXPECT_EQ(limited["measured_peaks"], free_plan["measured_peaks"]);
  Result r = run_gpurun({config, "--ckpt", dir / "ckpt", "--memory-limit", limit});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Issue 9: on the Fashion-MNIST example as shipped (a subset of its samples, so that it is
// fast), the plan's measured peak is the run's: within 15% of every epoch's peak_bytes, and so
// is each part the plan probed (evaluation at batch 500 being the largest here).
TEST(MemoryFit, ExampleConfigPlanPeakIsTheRunsPeak) {
  TempDir dir;
  const std::string example = std::string(GPURUN_SOURCE_DIR) + "/examples/fashion_mnist.yaml";
  const std::vector<std::string> subset{"data.train_samples=1024", "data.eval_samples=1000",
                                        "train.epochs=2"};
  Result r = run_gpurun(with_sets({example, "--ckpt", dir / "ckpt"}, subset));
  if (r.exit_code == 2 && contains(r.err, "fashion-mnist"))
    GTEST_SKIP() << "Fashion-MNIST is not installed: " << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto plans = events(dir / "ckpt", "plan");
  ASSERT_EQ(plans.size(), 1u);
  const nlohmann::json& plan = plans[0];
  const double planned = plan["measured_peak_bytes"];
  const auto epochs = events(dir / "ckpt", "epoch");
  ASSERT_EQ(epochs.size(), 2u);
  double largest = 0;
  for (const auto& e : epochs) {
    largest = std::max(largest, e["peak_bytes"].get<double>());
    for (const char* part : {"training", "evaluation", "checkpoint_capture"}) {
      const double ran = e["measured_peaks"].value(part, 0.0);
      const double probed = plan["measured_peaks"].value(part, 0.0);
      ASSERT_GT(ran, 0) << part << " in " << e.dump();
      EXPECT_LT(std::abs(probed - ran) / ran, 0.15)
          << part << ": plan " << probed << " vs epoch " << e["epoch"] << " " << ran;
    }
  }
  EXPECT_LT(std::abs(planned - largest) / largest, 0.15)
      << "plan " << planned << " vs largest epoch peak_bytes " << largest;
  // Printed as the user reads it.
  EXPECT_TRUE(contains(r.err, "peak memory: measured")) << r.err;
  EXPECT_TRUE(contains(r.err, "evaluation")) << r.err;
}

// Issue 11: a CPU run keeps the checkpoint's copy of its state between saves (a save then
// copies into memory that is already there) where the plan counts it: the run's training peak
// is the probed training peak plus the copy, as the plan says. Under a limit that the parts fit
// but training plus the copy does not, the copy is released after every save, the micro-batch
// stays, and the run fits the limit. Either way the run is the same, digest for digest.
TEST(MemoryFit, ACpuRunKeepsItsCheckpointCopyBetweenSavesOnlyWhereThePlanCountsIt) {
  TempDir dir;
  const std::string config =
      write_config(dir,
                   "model: {name: mlp, hidden: [1024, 1024]}\n"
                   "data: {name: idx, train_samples: 512, eval_samples: 256}\n"
                   "optim: {name: adam, lr: 0.001}\n"
                   "train: {epochs: 2, batch_size: 64, eval_batch_size: 256, threads: 1}\n"
                   "checkpoint: {every_steps: 3}\n");
  Result kept = run_gpurun({config, "--ckpt", dir / "kept"});
  ASSERT_EQ(kept.exit_code, 0) << kept.err;
  const nlohmann::json plan = events(dir / "kept", "plan").at(0);
  const nlohmann::json& peaks = plan["measured_peaks"];
  const int64_t buffers = peaks.value("checkpoint_buffers", int64_t{0});
  // Weights and Adam's two moments of 784x1024 + 1024x1024 + 1024x10 and the biases: 21.3 MiB.
  EXPECT_NEAR(static_cast<double>(buffers), 3 * 4 * 1863690.0, 0.01 * buffers) << plan.dump();
  const int64_t training = peaks["training"];
  EXPECT_EQ(plan["measured_peak_bytes"], training + buffers) << plan.dump();
  for (const auto& e : events(dir / "kept", "epoch")) {
    const double ran = e["measured_peaks"]["training"];
    EXPECT_LT(std::abs(ran - static_cast<double>(training + buffers)) / ran, 0.05)
        << "epoch " << e["epoch"] << ": the copy is held while training runs";
  }

  int64_t parts = 0;
  for (const char* part : {"training", "evaluation", "checkpoint_capture", "resume_loading"})
    parts = std::max(parts, peaks[part].get<int64_t>());
  ASSERT_LT(parts, training + buffers);
  const int64_t usable = (parts + training + buffers) / 2;  // headroom 0.1
  const std::string limit = std::to_string(static_cast<int64_t>(usable / 0.9));
  Result released = run_gpurun({config, "--ckpt", dir / "released", "--memory-limit", limit});
  ASSERT_EQ(released.exit_code, 0) << released.err;
  EXPECT_TRUE(contains(released.err, "is released after every save")) << released.err;
  EXPECT_TRUE(contains(released.err, "written before training goes on")) << released.err;
  // One plan: no out-of-memory fallback while a background write still held the copy.
  ASSERT_EQ(events(dir / "released", "plan").size(), 1u) << released.err;
  const nlohmann::json small = events(dir / "released", "plan").at(0);
  EXPECT_EQ(small["micro_batch"], 64) << small.dump();
  EXPECT_FALSE(small["measured_peaks"].contains("checkpoint_buffers")) << small.dump();
  EXPECT_EQ(small["measured_peaks"].value("checkpoint_copy", int64_t{0}), buffers) << small.dump();
  for (const auto& e : events(dir / "released", "epoch"))
    EXPECT_LT(e["peak_bytes"].get<int64_t>(), std::stoll(limit)) << e.dump();
  EXPECT_EQ(inspect(dir / "released")["model_digest"], inspect(dir / "kept")["model_digest"]);
}

// Issue 45, item 1: the example's CNN in bf16 under a limit that takes activation checkpointing
// and accumulation, saving every 3 steps in the background, ended elsewhere than the run at the
// same accumulation without checkpointing. Not the kernels: the copy a save takes was released
// after the save but alive while its write ran beside the next steps, which ran out of memory
// and fell back to smaller micro-batches (other arithmetic). Now such a save is written before
// training goes on: one plan, and the digest of the plain run.
TEST(MemoryFit, CheckpointingUnderALimitWithSavesTrainsAsTheRunWithoutIt) {
  TempDir dir;
  const std::vector<std::string> sets{"model.channels=[16, 32]", "data.train_samples=2048",
                                      "data.eval_samples=256",   "train.epochs=1",
                                      "train.threads=1",         "train.precision=bf16",
                                      "checkpoint.every_steps=3"};
  const std::string config = std::string(GPURUN_SOURCE_DIR) + "/examples/fashion_mnist.yaml";
  const int64_t need = plan_json(config, sets)["measured_peaks"]["training"];
  ASSERT_GT(need, 0);
  std::vector<std::string> limited = sets;
  limited.push_back("memory.strategy=checkpoint");
  Result ac = run_gpurun(with_sets(
      {config, "--ckpt", dir / "ac", "--memory-limit", std::to_string(need * 6 / 10)}, limited));
  ASSERT_EQ(ac.exit_code, 0) << ac.err;
  const auto plans = events(dir / "ac", "plan");
  ASSERT_EQ(plans.size(), 1u) << "an out-of-memory fallback: " << ac.err;
  ASSERT_TRUE(plans[0]["activation_checkpointing"].get<bool>()) << plans[0].dump();
  // With accumulation where checkpointing alone does not fit (4 here); either way the plain run
  // takes the same.
  const int64_t accumulation = plans[0]["accumulation_steps"];

  std::vector<std::string> plain = sets;
  plain.push_back("train.accumulation_steps=" + std::to_string(accumulation));
  Result pl = run_gpurun(with_sets({config, "--ckpt", dir / "plain"}, plain));
  ASSERT_EQ(pl.exit_code, 0) << pl.err;
  EXPECT_FALSE(events(dir / "plain", "plan").at(0)["activation_checkpointing"].get<bool>());
  EXPECT_EQ(inspect(dir / "ac")["model_digest"], inspect(dir / "plain")["model_digest"]);
}

// Issue 16 defect 8: a resume that will be refused (here a changed training key) is refused
// before any memory probe runs, so a refusal costs no device time.
TEST(MemoryFit, RefusedResumeProbesNothing) {
  TempDir dir;
  const std::string config = write_config(dir, small_config(256, 32, 1));
  const std::string ckpt = dir / "ckpt";
  Result first = run_gpurun({config, "--ckpt", ckpt});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const size_t plan_events = events(ckpt, "plan").size();
  // Another global batch: the saved plan cannot be reused, so planning would probe.
  Result refused = run_gpurun({config, "--ckpt", ckpt, "--resume", "--set", "train.batch_size=64"},
                              {{"GPURUN_LOG_LEVEL", "debug"}});
  EXPECT_EQ(refused.exit_code, 3) << refused.err;
  EXPECT_TRUE(contains(refused.err, "cannot resume")) << refused.err;
  EXPECT_TRUE(contains(refused.err, "train.batch_size")) << refused.err;
  for (const char* planning : {"probe micro-batch", "memory plan:", "peak memory:"})
    EXPECT_FALSE(contains(refused.err, planning)) << planning << " in\n" << refused.err;
  EXPECT_EQ(events(ckpt, "plan").size(), plan_events);
}

}  // namespace
}  // namespace gpurun::test

namespace gpurun::test {
namespace {

// The probe leaves no trace: weights, buffers, RNG (dropout) and data order are restored, so
// the number of probe steps cannot change the trained weights.
TEST(MemoryFit, ProbingDoesNotChangeTraining) {
  TempDir dir;
  const std::string config =
      write_config(dir,
                   "model: {name: cnn, channels: [8], dropout: 0.5, batch_norm: true}\n"
                   "data: {name: idx, train_samples: 256, eval_samples: 100}\n"
                   "train: {epochs: 1, batch_size: 32, eval_batch_size: 100, threads: 1}\n");
  std::vector<std::string> digests;
  for (const char* steps : {"memory.probe_steps=1", "memory.probe_steps=5"}) {
    const std::string ckpt = dir / (std::string("run-") + steps[19]);
    Result r = run_gpurun({config, "--ckpt", ckpt, "--set", steps});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    digests.push_back(inspect(ckpt)["model_digest"]);
  }
  EXPECT_EQ(digests[0], digests[1]);
}

TEST(MemoryFit, AUsersCardsFileReplacesTheTable) {
  TempDir dir;
  const std::string config = write_config(dir, kCnn);
  const std::string cards = write_config(dir,
                                         "cards:\n"
                                         "  - {name: tiny, memory: 1MiB, bf16_tflops: 10}\n"
                                         "  - {name: lab card, memory: 8GiB, bf16_tflops: 20, "
                                         "fp32_tflops: 5, price_per_hour: 0.5}\n"
                                         "  - {name: no fp32, memory: 8GiB, bf16_tflops: 20}\n",
                                         "cards.yaml");
  Result first = run_gpurun({"plan", config, "--json", "--cards", cards});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // A deadline of a third and a bit of the lab card's time: 4 cards (3 do not divide 128).
  const double hours = nlohmann::json::parse(first.out)["cards"][1]["hours_to_finish"];
  EXPECT_TRUE(nlohmann::json::parse(first.out)["cards"][1]["cards_for_deadline"].is_null());
  Result r = run_gpurun({"plan", config, "--json", "--cards", cards, "--deadline",
                         nlohmann::json(hours / 3.5).dump()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["cards"].size(), 3u) << r.out;
  EXPECT_EQ(j["cards"][0]["name"], "tiny");
  EXPECT_EQ(j["cards"][0]["memory_bytes"], 1 << 20);
  EXPECT_EQ(j["cards"][0]["fits"], "no");  // and exit 0: every card is reported
  EXPECT_TRUE(j["cards"][0]["hours_to_finish"].is_null());
  const auto& lab = j["cards"][1];
  EXPECT_EQ(lab["fits"], "as_configured");
  EXPECT_NEAR(lab["cost_to_finish"].get<double>(), lab["hours_to_finish"].get<double>() * 0.5,
              1e-12);
  // A deadline shorter than the run: more cards, dividing the global batch of 128.
  EXPECT_EQ(lab["cards_for_deadline"], 4) << lab.dump();
  // This fp32 run's time on a card without fp32_tflops is not guessed; no price: no cost.
  EXPECT_TRUE(j["cards"][2]["predicted_step_seconds"].is_null());
  EXPECT_TRUE(j["cards"][2]["cost_to_finish"].is_null());
  EXPECT_TRUE(j["cards"][2]["lost_cost_per_reclaim"].is_null());
  EXPECT_NEAR(lab["lost_cost_per_reclaim"].get<double>(),
              lab["lost_hours_per_reclaim"].get<double>() * 0.5, 1e-12);

  // A typo names the key and suggests the right one; exit 2.
  const std::string typo =
      write_config(dir, "cards:\n  - {name: x, memroy: 8GiB, bf16_tflops: 20}\n", "typo.yaml");
  Result bad = run_gpurun({"plan", config, "--cards", typo});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(contains(bad.err, "unknown key memroy; did you mean memory?")) << bad.err;
}

TEST(MemoryFit, AModelWhoseWeightsDoNotFitIsPlannedFromTheEstimate) {
  // The cnn describes no activations of its own: its layers are walked, with real weights.
  TempDir dir;
  const std::string config = write_config(dir, kCnn);
  Result r = run_gpurun({"plan", config, "--json", "--memory-limit", "64KiB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["estimate_only"], true);
  EXPECT_TRUE(contains(j["why"].get<std::string>(), "weights alone do not fit")) << j["why"];
  EXPECT_GT(j["breakdown"]["activations"].get<int64_t>(), 0);
  EXPECT_EQ(j["cards"][0]["fits"], "as_configured") << j["cards"][0].dump();
  // Weights that fit but a run that does not (its optimizer state alone is over 1 MiB): exit 0,
  // the cards still reported, and why.
  Result small = run_gpurun({"plan", config, "--json", "--memory-limit", "1MiB"});
  ASSERT_EQ(small.exit_code, 0) << small.err;
  const nlohmann::json k = nlohmann::json::parse(small.out);
  EXPECT_EQ(k["estimate_only"], true);
  EXPECT_TRUE(contains(k["why"].get<std::string>(), "the run does not fit this device")) << k;
  EXPECT_EQ(k["cards"].size(), 9u);
}

TEST(MemoryFit, TheEstimateOfA7BGptNeedsNeitherItsWeightsNorAMinute) {
  // About 7B parameters (32 blocks of width 4096), context 2048, bf16, AdamW: planned from the
  // estimate alone on a 24 GiB machine that could not hold its weights and optimizer state.
  TempDir dir;
  const std::string config =
      write_config(dir,
                   "model: {name: gpt, layers: 32, heads: 32, width: 4096, dropout: 0}\n"
                   "data: {name: text, path: /usr/local/share/gpurun/kjv.txt, context: 2048, "
                   "train_samples: 1000, eval_samples: 100}\n"
                   "optim: {name: adamw, lr: 0.0003}\n"
                   "train: {epochs: 1, batch_size: 8, precision: bf16}\n");
  const auto start = std::chrono::steady_clock::now();
  Result r = run_gpurun({"plan", config, "--estimate-only", "--json"});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(seconds, 60);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_LT(j["host_peak_rss_bytes"].get<int64_t>(), int64_t{4} << 30);
  const int64_t n = j["parameters"]["total"].get<int64_t>();
  EXPECT_GT(n, 6'000'000'000);
  EXPECT_LT(n, 7'500'000'000);
  const auto& b = j["breakdown"];
  // fp32 weights (autocast's recipe), their gradients, Adam's two moments, bf16 copies.
  EXPECT_EQ(b["gradients"], b["parameters"]);
  EXPECT_EQ(b["optimizer_state"].get<int64_t>(), 2 * b["parameters"].get<int64_t>());
  EXPECT_NEAR(b["weight_casts"].get<double>(), b["parameters"].get<double>() / 2, 0.01 * n);
  // Activation checkpointing keeps the 32 block inputs instead of every block's tensors.
  EXPECT_LT(j["breakdown_checkpointed"]["activations"].get<double>(),
            0.25 * b["activations"].get<double>());
  bool any_fits = false;
  for (const auto& card : j["cards"]) any_fits = any_fits || card["fits"] != "no";
  EXPECT_TRUE(any_fits) << r.out;  // the 141 GB card, with a plan
  EXPECT_EQ(j["cards"][0]["fits"], "no");
}

}  // namespace
}  // namespace gpurun::test

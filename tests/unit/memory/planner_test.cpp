// The planner over synthetic probes: peak(b) = fixed + b x per_sample (x 0.4 activations with
// checkpointing), step time per sample falling with the micro-batch.
#include <gtest/gtest.h>

#include "gpurun/errors.h"
#include "memory/planner.h"

namespace gpurun {
namespace {

struct Device {
  int64_t fixed = 1000, per_sample = 100;
  double checkpoint_activation_factor = 0.4, checkpoint_time_factor = 1.3;
  int64_t eval_per_sample = 20;
  int64_t capture_extra = 200, resume_extra = 300;  // beyond `fixed`, whatever the plan
  int64_t copy_bytes = 0;                           // a CPU run's checkpoint copy
  int calls = 0;
  std::vector<std::pair<int64_t, bool>> probed;

  Probe train(int64_t micro, bool ckpt) {
    ++calls;
    probed.emplace_back(micro, ckpt);
    Probe p;
    p.micro_batch = micro;
    p.checkpointing = ckpt;
    const double act =
        static_cast<double>(micro * per_sample) * (ckpt ? checkpoint_activation_factor : 1);
    p.peak_bytes = fixed + static_cast<int64_t>(act);
    p.step_seconds = (0.01 + 0.001 * micro) * (ckpt ? checkpoint_time_factor : 1.0);
    return p;
  }
  Probe eval(int64_t batch) {
    Probe p;
    p.micro_batch = batch;
    p.peak_bytes = fixed + batch * eval_per_sample;
    return p;
  }
  CheckpointProbes checkpoint() {
    CheckpointProbes c;
    c.capture.peak_bytes = fixed + capture_extra;
    c.resume.peak_bytes = fixed + resume_extra;
    c.copy_bytes = copy_bytes;
    return c;
  }
};

PlanRequest request(int64_t capacity, const std::string& strategy = "auto") {
  PlanRequest r;
  r.global_batch = 64;
  r.micro_batch = 64;
  r.eval_batch = 64;
  r.capacity_bytes = capacity;
  r.headroom = 0.0;
  r.strategy = memory_strategy(strategy);
  // The planner names a card through the caller's table (run_setup.h: the bundled cards).
  r.card_for = [](int64_t need) -> std::string {
    for (const int64_t gib : {24, 48, 80})
      if (need <= (gib << 30)) return std::to_string(gib) + " GB";
    return "";
  };
  return r;
}

MemoryPlan plan_for(Device& d, const PlanRequest& r) {
  return choose_plan(
      r, [&](int64_t m, bool c) { return d.train(m, c); },
      [&](int64_t b, const MemoryPlan&) { return d.eval(b); },
      [&](const MemoryPlan&) { return d.checkpoint(); });
}

TEST(Planner, FitsAsConfiguredWithOneProbe) {
  Device d;
  MemoryPlan p = plan_for(d, request(100000));
  EXPECT_EQ(p.micro_batch, 64);
  EXPECT_EQ(p.accumulation_steps, 1);
  EXPECT_FALSE(p.activation_checkpointing);
  EXPECT_EQ(p.measured_peak_bytes, 1000 + 6400);
  EXPECT_EQ(d.calls, 1);
}

TEST(Planner, AccumulationTakesTheLargestFittingDivisor) {
  Device d;
  // 1000 + 100 b <= 2700  ->  b <= 17; divisors of 64: 16.
  MemoryPlan p = plan_for(d, request(2700, "accumulate"));
  EXPECT_EQ(p.micro_batch, 16);
  EXPECT_EQ(p.accumulation_steps, 4);
  EXPECT_EQ(p.micro_batch * p.accumulation_steps * p.world_size, p.global_batch);
  EXPECT_LE(p.measured_peak_bytes, 2700);
  EXPECT_LE(d.calls, 4) << "the line fit should avoid probing every divisor";
}

TEST(Planner, CheckpointingAloneWhenItFits) {
  Device d;
  // plain 64: 7400; checkpointed 64: 1000 + 2560 = 3560.
  MemoryPlan p = plan_for(d, request(4000, "checkpoint"));
  EXPECT_EQ(p.micro_batch, 64);
  EXPECT_TRUE(p.activation_checkpointing);
}

TEST(Planner, AutoTakesTheFastestFittingOption) {
  Device d;
  // accumulation fits at 16 (slow per sample: (0.01+0.016)/16 = 1.6 ms); checkpointing at 64
  // ((0.01+0.064)*1.3/64 = 1.5 ms): checkpointing wins.
  MemoryPlan p = plan_for(d, request(4000));
  EXPECT_TRUE(p.activation_checkpointing);
  EXPECT_EQ(p.micro_batch, 64);
  d = Device();
  d.checkpoint_time_factor = 2.0;  // now accumulation is faster
  p = plan_for(d, request(4000));
  EXPECT_FALSE(p.activation_checkpointing);
  EXPECT_EQ(p.micro_batch, 16);
  EXPECT_NE(p.reason.find("fastest"), std::string::npos);
}

TEST(Planner, BothWhenNeitherAloneFits) {
  Device d;
  // checkpointed: 1000 + 40 b <= 1700 -> b <= 17 -> 16; plain: b <= 7 -> 4.
  MemoryPlan p = plan_for(d, request(1700));
  EXPECT_EQ(p.micro_batch * p.accumulation_steps, 64);
  EXPECT_LE(p.measured_peak_bytes, 1700);
  if (p.activation_checkpointing) {
    EXPECT_EQ(p.micro_batch, 16);
  }
}

TEST(Planner, NothingFitsNamesNeedCapacityAndACard) {
  Device d;
  d.fixed = int64_t{30} << 30;  // 30 GiB of weights and optimizer state
  try {
    plan_for(d, request(int64_t{24} << 30));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bytes"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(int64_t{24} << 30)), std::string::npos) << m;
    EXPECT_NE(m.find("48 GB"), std::string::npos) << m;
  }
}

// Issue 31, item 1: a probe the estimate rules out is handed to the planner unrun. It never
// fits and never becomes a point of the line through measured probes, so the search goes on to
// measured sizes; only those are adopted.
TEST(Planner, AnEstimatedProbeIsNeverAdoptedNorAPointOfTheLine) {
  Device d;
  const PlanRequest r = request(1700, "accumulate");
  std::vector<int64_t> estimated;
  MemoryPlan p = choose_plan(
      r,
      [&](int64_t m, bool c) {
        if (m > 8) {  // "the estimate exceeds the capacity": a wild number, not measured
          estimated.push_back(m);
          Probe e;
          e.micro_batch = m;
          e.checkpointing = c;
          e.peak_bytes = 1'000'000'000;
          e.estimated = true;
          return e;
        }
        return d.train(m, c);
      },
      [&](int64_t b, const MemoryPlan&) { return d.eval(b); },
      [&](const MemoryPlan&) { return d.checkpoint(); });
  EXPECT_FALSE(estimated.empty());
  // 1000 + 100 b <= 1700: 4 is the largest divisor of 64 that fits; the wild estimates did not
  // bend the line that proposed it.
  EXPECT_EQ(p.micro_batch, 4);
  EXPECT_EQ(p.measured.training, 1400);
  for (const auto& [m, c] : d.probed) EXPECT_LE(m, 8);
}

// A step that ran out of memory tells only that it needs more than the capacity: the message
// says so, and never "capacity + 1 bytes".
TEST(Planner, AnOutOfMemoryNeedIsMoreThanTheCapacityOrItsEstimate) {
  const PlanRequest r = request(int64_t{24} << 30, "accumulate");
  for (const int64_t estimate : {int64_t{0}, int64_t{40} << 30}) {
    try {
      choose_plan(
          r,
          [&](int64_t m, bool c) {
            Probe p;
            p.micro_batch = m;
            p.checkpointing = c;
            p.out_of_memory = true;
            p.estimated_bytes = estimate;
            return p;
          },
          [&](int64_t, const MemoryPlan&) { return Probe(); },
          [&](const MemoryPlan&) { return CheckpointProbes(); });
      FAIL() << "expected ConfigError";
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find(std::to_string((int64_t{24} << 30) + 1)), std::string::npos) << m;
      if (estimate == 0) {
        EXPECT_NE(m.find("needs more than the device's " + std::to_string(int64_t{24} << 30)),
                  std::string::npos)
            << m;
      } else {
        EXPECT_NE(m.find("needs " + std::to_string(estimate) + " bytes"), std::string::npos) << m;
        EXPECT_NE(m.find("48 GB"), std::string::npos) << m;
      }
    }
  }
}

TEST(Planner, StrategyNoneRefusesWhatDoesNotFit) {
  Device d;
  EXPECT_THROW(plan_for(d, request(2000, "none")), ConfigError);
}

// Case 9: memory that fits training micro-batch 8 but not eval batch 64: only eval shrinks.
TEST(Planner, EvalOnlyExcessShrinksOnlyTheEvalBatch) {
  Device d;
  d.eval_per_sample = 40;  // eval 64: 1000 + 2560 = 3560; train 8: 1800
  PlanRequest r = request(2000);
  r.global_batch = 8;
  r.micro_batch = 8;
  MemoryPlan p = plan_for(d, r);
  EXPECT_EQ(p.micro_batch, 8);
  EXPECT_EQ(p.accumulation_steps, 1);
  EXPECT_EQ(p.eval_batch, 16);  // 64 -> 32 (2280) -> 16 (1640)
  EXPECT_EQ(p.micro_batch * p.accumulation_steps * p.world_size, 8);
}

TEST(Planner, OutOfMemoryProbeCountsAsNotFitting) {
  Device d;
  auto train = [&](int64_t m, bool c) {
    Probe p = d.train(m, c);
    if (p.peak_bytes > 3000) {
      p.out_of_memory = true;
      p.peak_bytes = 0;
    }
    return p;
  };
  MemoryPlan p = choose_plan(
      request(3000, "accumulate"), train, [&](int64_t b, const MemoryPlan&) { return d.eval(b); },
      [&](const MemoryPlan&) { return d.checkpoint(); });
  EXPECT_EQ(p.micro_batch, 16);
}

// The plan's measured peak is the run's: the largest of training steps, evaluation, checkpoint
// capture and resume loading, each reported.
TEST(Planner, MeasuredPeakIsTheLargestPart) {
  Device d;
  MemoryPlan p = plan_for(d, request(100000));
  EXPECT_EQ(p.measured.training, 7400);
  EXPECT_EQ(p.measured.evaluation, 1000 + 64 * 20);
  EXPECT_EQ(p.measured.checkpoint_capture, 1200);
  EXPECT_EQ(p.measured.resume_loading, 1300);
  EXPECT_EQ(p.measured_peak_bytes, 7400);
  EXPECT_EQ(p.measured.largest_part(), "training");

  d.eval_per_sample = 200;  // evaluation 1000 + 12800 exceeds training 7400
  p = plan_for(d, request(100000));
  EXPECT_EQ(p.measured_peak_bytes, 13800);
  EXPECT_EQ(p.to_json()["peak_part"], "evaluation");
  EXPECT_EQ(p.to_json()["measured_peaks"]["evaluation"], 13800);

  d.eval_per_sample = 20;
  d.capture_extra = 9000;  // a large model's copy for the checkpoint
  p = plan_for(d, request(100000));
  EXPECT_EQ(p.measured_peak_bytes, 10000);
  EXPECT_EQ(p.measured.largest_part(), "checkpoint_capture");
}

// A CPU run's checkpoint copy stays between saves when training and evaluation fit with it
// (then they count it, and the plan's peak is training + the copy), and is released after every
// save when they do not: the micro-batch is never made smaller for it, and an out-of-memory
// halving releases it.
TEST(Planner, CheckpointBuffersAreKeptOnlyWhereTrainingAndEvaluationFitWithThem) {
  Device d;
  d.copy_bytes = 700;  // training 7400, evaluation 2280, capture 1200, resume 1300
  MemoryPlan p = plan_for(d, request(8100));
  EXPECT_EQ(p.micro_batch, 64);
  EXPECT_EQ(p.measured.checkpoint_buffers, 700);
  EXPECT_EQ(p.measured_peak_bytes, 8100);
  EXPECT_EQ(p.measured.largest_part(), "training");
  EXPECT_EQ(p.to_json()["measured_peaks"]["checkpoint_buffers"], 700);
  EXPECT_EQ(p.to_json()["measured_peaks"]["training"], 7400) << "as probed";
  EXPECT_NE(p.measured.to_string().find("checkpoint buffers kept between saves"), std::string::npos)
      << p.measured.to_string();
  EXPECT_EQ(MemoryPlan::from_json(p.to_json()).measured.checkpoint_buffers, 700);

  p = plan_for(d, request(8099));
  EXPECT_EQ(p.micro_batch, 64) << "the micro-batch does not shrink for the copy";
  EXPECT_EQ(p.measured.checkpoint_buffers, 0);
  EXPECT_EQ(p.measured_peak_bytes, 7400);
  EXPECT_FALSE(p.to_json()["measured_peaks"].contains("checkpoint_buffers"));

  d.eval_per_sample = 200;  // evaluation 13800: the largest part with the copy too
  p = plan_for(d, request(100000));
  EXPECT_EQ(p.measured_peak_bytes, 14500);
  EXPECT_EQ(p.measured.largest_part(), "evaluation");

  p = plan_for(d, request(100000));
  EXPECT_EQ(halve_micro_batch(p).measured.checkpoint_buffers, 0);
}

// Training and evaluation shrink to fit; checkpoint capture and resume loading cannot, and the
// refusal says so instead of trying smaller micro-batches.
TEST(Planner, CaptureOrResumeThatDoesNotFitIsRefusedSayingTheMicroBatchCannotHelp) {
  for (const bool capture : {true, false}) {
    Device d;
    (capture ? d.capture_extra : d.resume_extra) = 5000;  // 6000 > the 3000 usable
    try {
      plan_for(d, request(3000));
      ADD_FAILURE() << "no ConfigError";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(capture ? "checkpoint capture needs 6000 bytes"
                                  : "resume loading needs 6000 bytes"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("cannot make it smaller"), std::string::npos) << what;
      EXPECT_NE(what.find("3000 bytes"), std::string::npos) << what;
    }
  }
}

TEST(Planner, HalvingKeepsTheGlobalBatchAndStopsAtOne) {
  MemoryPlan p;
  p.global_batch = 48;
  p.world_size = 2;
  p.micro_batch = 24;
  p.accumulation_steps = 1;
  p = halve_micro_batch(p);
  EXPECT_EQ(p.micro_batch, 12);
  EXPECT_EQ(p.accumulation_steps, 2);
  p = halve_micro_batch(halve_micro_batch(p));  // 6, 3
  EXPECT_EQ(p.micro_batch, 3);
  p = halve_micro_batch(p);
  EXPECT_EQ(p.micro_batch, 1);
  EXPECT_EQ(p.accumulation_steps, 24);
  EXPECT_THROW(halve_micro_batch(p), ConfigError);
}

TEST(Planner, PlanJsonRoundTrip) {
  Device d;
  MemoryPlan p = plan_for(d, request(2700));
  MemoryPlan q = MemoryPlan::from_json(p.to_json());
  EXPECT_EQ(q.to_json(), p.to_json());
}

}  // namespace
}  // namespace gpurun

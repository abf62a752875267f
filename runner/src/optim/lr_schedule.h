// The learning-rate schedule (schedule.*): a pure function of the optimizer step.
#pragma once

#include <cstdint>

#include "gpurun/config.h"

namespace gpurun {

/// The learning rate for optimizer step `step` (0-based) of `total_steps`. A pure function of
/// the step, so a resumed run needs no scheduler state beyond global_step, and the schedule
/// advances once per optimizer step, never per micro-batch.
///   warm-up (step < warmup_steps): lr * (step + 1) / warmup_steps
///   constant: lr
///   step:     lr * gamma^floor(step / step_size)
///   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2, t = (step - warmup) / (total -
///   warmup)
///             (SGDR, Loshchilov & Hutter 2017, without restarts)
double learning_rate(const OptimConfig& optim, const ScheduleConfig& schedule, int64_t step,
                     int64_t total_steps);

}  // namespace gpurun

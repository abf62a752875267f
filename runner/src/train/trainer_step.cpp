// One optimizer step of the training loop (train/trainer_loop.h): its micro-batches from the
// loader, the gradient sync and the update, the fallback after out of memory; and evaluation.
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "gpurun/model.h"
#include "model/micro_batch_step.h"
#include "optim/lr_schedule.h"
#include "optim/torch_optimizer.h"
#include "train/trainer_loop.h"
#include "util/faults.h"
#include "util/units.h"

namespace gpurun::detail {

double Trainer::optimizer_step(const at::Tensor& shard, int64_t window) {
  for (;;) {
    optimizer_->zero_grad();
    double loss = 0;
    bool out_of_memory = false;
    try {
      bool first = true;  // only the step's first micro-batch may end its wait for a stop
      loss = accumulate_gradients(
          *model_,
          [&](const at::Tensor& chunk) {
            return loader_->next(chunk, std::exchange(first, false));
          },
          shard, plan_.micro_batch, device_, window, session_.loss,
          {session_.precision.precision, scaler_ ? scaler_->scale() : at::Tensor()});
    } catch (const c10::OutOfMemoryError& e) {
      if (!comm_) {
        shrink_after_oom();
        continue;
      }
      optimizer_->release_gradients();
      out_of_memory = true;
    } catch (const WaitInterrupted&) {
      // A stop while waiting for a batch: nothing of this step is applied yet, so the save is
      // the state of the last step boundary, and Stopped follows.
      stop_if_signalled();
      open_loader();  // no stop after all: the step again
      continue;
    } catch (const BatchFailed& e) {
      throw BatchFailed("optimizer step " + std::to_string(global_step_ + 1) + " (epoch " +
                        std::to_string(epoch_ + 1) + ", micro-batches of " +
                        std::to_string(plan_.micro_batch) + "): " + e.what());
    }
    std::vector<double> control{
        loss, stop_signal() != 0 ? 1.0 : 0.0, rank_ == 0 && checkpointer_.minutes_due() ? 1.0 : 0.0,
        out_of_memory ? 1.0 : 0.0, config_.cost.budget > 0 && budget_due() ? 1.0 : 0.0};
    const CollectiveStats before = comm_ ? comm_->stats() : CollectiveStats{};
    if (comm_) comm_->set_step(global_step_ + 1);
    // Replicated: the all-reduce into every .grad; flat: the reduce-scatter into this rank's
    // slice. An inf on any rank reaches every rank's decision, so all skip alike.
    optimizer_->reduce_gradients(control);
    if (comm_) {
      loss = control[0];
      agreed_stop_ = control[1] > 0;
      agreed_save_ = control[2] > 0;
      agreed_budget_ = control[4] > 0;
      if (control[3] > 0) {
        shrink_after_oom();
        continue;
      }
    }
    if (scaler_) optimizer_->unscale(*scaler_);
    if (config_.optim.grad_clip > 0) optimizer_->clip_grad_norm(config_.optim.grad_clip);
    lr_ = learning_rate(config_.optim, config_.schedule, global_step_, total_steps_);
    if (!optimizer_->step(lr_, scaler_ ? &*scaler_ : nullptr)) ++skipped_steps_;
    if (scaler_) scaler_->update();
    data_wait_seconds_ += loader_->take_wait_seconds();
    if (comm_) {
      // The whole step's traffic: a sharded step's all-gather comes after the update.
      const CollectiveStats& after = comm_->stats();
      metrics_.add_traffic({1, after.all_reduce_calls - before.all_reduce_calls,
                            after.all_reduce_bytes - before.all_reduce_bytes,
                            after.moved_bytes(world_) - before.moved_bytes(world_)});
    }
    return loss;
  }
}

void Trainer::hog_memory() {
  const int64_t now = session_.meter->current_bytes();
  // The training steps' part: evaluation's or a capture's larger peak would leave room.
  const int64_t step_peak =
      plan_.measured.training > 0 ? plan_.measured.training : plan_.measured_peak_bytes;
  const int64_t step_adds = std::max<int64_t>(step_peak - now, 2 << 20);
  const int64_t bytes = session_.meter->capacity_bytes() - now - step_adds / 2;
  if (bytes > 0) hog_ = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
}

void Trainer::shrink_after_oom() {
  hog_ = at::Tensor();  // a test fault's memory goes with the failure it caused
  optimizer_->release_gradients();
  MemoryPlan smaller = halve_micro_batch(plan_);
  checkpointer_.keep_host_buffers(smaller.measured.checkpoint_buffers > 0);
  checkpointer_.write_before_training(write_before_training(smaller));
  // What the failed attempt cached goes back to the device before the smaller one runs.
  session_.meter->release_cached();
  reporter_.end_progress();
  spdlog::warn(
      "out of memory at global step {} with micro-batch {}{}; memory back to {}; "
      "retrying with micro-batch {} x accumulation {}",
      global_step_, plan_.micro_batch, comm_ ? " (on at least one rank)" : "",
      format_bytes(session_.meter->current_bytes()), smaller.micro_batch,
      smaller.accumulation_steps);
  plan_ = smaller;
  resume_check_ = ResumeCheck();  // smaller micro-batches sum the losses in another order
  open_loader();                  // the step again, in the smaller micro-batches
  nlohmann::json plan_event = plan_.to_json();
  plan_event["global_step"] = global_step_;
  plan_event["out_of_memory"] = true;  // a fallback, not a start: gpurun report marks it
  reporter_.event("plan", plan_event);
}

void Trainer::open_loader() {
  if (loader_) data_wait_seconds_ += loader_->take_wait_seconds();
  loader_.reset();  // its workers joined before the next ones start
  std::function<bool()> stop;
  if (!comm_) stop = [] { return stop_signal() != 0; };
  loader_ = std::make_unique<BatchLoader>(
      *data_.train,
      epoch_requests(order_, position_, plan_.global_batch, plan_.micro_batch, rank_, world_,
                     config_.train.seed, epoch_),
      BatchLoader::Options{workers_, prefetch_, device_, std::move(stop)});
}

void Trainer::sync_buffers() {
  if (!comm_) return;
  std::vector<at::Tensor> buffers = model_->buffers();
  if (!buffers.empty()) comm_->broadcast_tensors(buffers);
}

std::pair<double, double> Trainer::evaluate() {
  // Rank r evaluates samples r, r + world, ...; the sums are added over the ranks.
  const int64_t n = data_.eval->size();
  const at::Tensor mine_indices = at::arange(rank_, n, world_, at::kLong);
  // No stop is taken while evaluation waits: its batches come, and the stop at the epoch's
  // end saves.
  BatchLoader loader(*data_.eval, eval_requests(mine_indices, plan_.eval_batch, config_.train.seed),
                     {workers_, prefetch_, device_, {}});
  const EvalSums mine = evaluate_in_batches(
      *model_, [&](const at::Tensor& chunk) { return loader.next(chunk); }, mine_indices,
      plan_.eval_batch, device_, session_.loss, [this] { reporter_.heartbeat(global_step_); },
      session_.precision.precision);
  eval_wait_seconds_ = loader.take_wait_seconds();
  EvalSums all = mine;
  if (comm_) {
    const auto sums = comm_->all_reduce(
        {all.loss_sum, all.correct, all.positions, all.counted, all.counted_loss_sum},
        Collectives::Op::kSum);
    all.loss_sum = sums[0];
    all.correct = sums[1];
    all.positions = sums[2];
    all.counted = sums[3];
    all.counted_loss_sum = sums[4];
  }
  return {all.loss(n), all.accuracy()};
}

}  // namespace gpurun::detail

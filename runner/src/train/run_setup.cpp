#include "train/run_setup.h"

#include <ATen/Parallel.h>
#include <torch/utils.h>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "config/paths.h"
#include "config/rules.h"
#include "data/data_stage.h"
#include "distributed/collectives.h"
#include "forecast/cards.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "memory/meter.h"
#include "model/activation_checkpointing.h"
#include "model/fine_tune.h"
#include "model/hf_config.h"
#include "model/torchscript_model.h"
#include "model/without_weights.h"
#include "optim/step_optimizer.h"
#include "s3/s3_settings.h"
#include "train/device.h"
#include "train/hf_weights.h"
#include "train/suspicious_settings.h"
#include "util/signals.h"
#include "util/units.h"

namespace gpurun {

int64_t memory_limit_bytes(const RunConfig& config, int64_t memory_limit) {
  if (memory_limit > 0) return memory_limit;
  if (config.memory.capacity != "auto") return parse_size(config.memory.capacity);
  return 0;
}

namespace {

/// The model of `config` for `s.data`, with its LoRA adapters and frozen parameters, into
/// `s.model` and `s.lora_layers`.
void build_model(const RunConfig& config, const Registry& registry, Session& s) {
  ModelConfig model = config.model;
  model.path = config_path(config, model.path);  // model.name hf: beside run.yaml
  s.model = config.model.torchscript.empty()
                ? registry.make_model(model, s.data.input_shape, s.data.num_classes)
                : load_torchscript_model(config_path(config, config.model.torchscript),
                                         s.data.input_shape, s.data.num_classes);
  // Adapters before the weights move: lora_A and lora_B are parameters like the others.
  if (config.model.lora.rank > 0) s.lora_layers = add_lora_adapters(*s.model, config.model.lora);
  if (!config.model.freeze.empty()) freeze_parameters(*s.model, config.model.freeze);
  if (count_parameters(*s.model).trainable == 0)
    throw ConfigError("model.freeze" +
                      std::string(config.model.lora.rank > 0 ? " with model.lora" : "") +
                      " leaves no parameter to train: every parameter of the model matches a "
                      "pattern");
}

/// Gives every floating-point tensor of `model`'s state the dtype `held` (held_dtype()) without
/// its values: a model built WithoutWeights, whose tensors cost address space until written,
/// estimated as the run will hold it.
void hold_shapes(torch::nn::Module& model, std::optional<c10::ScalarType> held) {
  if (!held) return;
  torch::NoGradGuard no_grad;
  for (auto& entry : state_dict(model))
    if (entry.second.is_floating_point())
      entry.second.set_data(at::empty(entry.second.sizes(), entry.second.options().dtype(*held)));
}

/// Gives every tensor of `model`'s state a storage of its own, allocated now (under the meter
/// when one is installed): floating-point ones cast to `held` when given (held_dtype()), the
/// others copied.
void hold_model(torch::nn::Module& model, std::optional<c10::ScalarType> held) {
  torch::NoGradGuard no_grad;
  for (auto& entry : state_dict(model)) {
    at::Tensor& t = entry.second;
    t.set_data(held && t.is_floating_point() ? t.to(*held, false, /*copy=*/true) : t.clone());
  }
}

}  // namespace

namespace {
nlohmann::json state_json(const StateShape& state) {
  return {{"trainable", state.trainable},
          {"element_bytes", state.trainable_element_bytes},
          {"other_bytes", state.other_bytes},
          {"other_float_bytes", state.other_float_bytes},
          {"other_float_numel", state.other_float_numel}};
}

StateShape state_from_json(const nlohmann::json& state) {
  StateShape s;
  s.trainable = state["trainable"].get<std::vector<std::pair<std::string, std::vector<int64_t>>>>();
  s.trainable_element_bytes = state["element_bytes"].get<int64_t>();
  s.other_bytes = state["other_bytes"].get<int64_t>();
  s.other_float_bytes = state["other_float_bytes"].get<int64_t>();
  s.other_float_numel = state["other_float_numel"].get<int64_t>();
  return s;
}
}  // namespace

ModelShape probe_model_shape(const RunConfig& config, const Registry& registry,
                             const DatasetSplits& data, c10::Device target, Precision precision,
                             int64_t lora_rank) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    close(fds[0]);
    spdlog::set_level(spdlog::level::off);  // the parent builds the model again and says it all
    nlohmann::json answer;
    try {
      Session s;
      s.data = data;
      WithoutWeights without_weights;
      build_model(config, registry, s);
      // In the dtype the run will hold it in: shapes and dtypes, never values (a copy would run
      // LibTorch's OpenMP team, which a forked child does not have: it waits on it forever).
      hold_shapes(*s.model, held_dtype(config, precision));
      int64_t weights = 0;
      for (const auto& entry : state_dict(*s.model))
        weights += static_cast<int64_t>(entry.second.nbytes());
      const bool describes = static_cast<bool>(s.model->activation_estimate());
      // A model that does not describe its activations would be walked by running its layers,
      // which needs real weights: its state alone here.
      const auto one = [&](bool checkpointing) {
        return describes ? estimate_peak(*s.model, config.optim, data.input_shape, 1, checkpointing,
                                         target, precision)
                         : estimate_state(*s.model, config.optim, precision);
      };
      answer = {{"weight_bytes", weights},
                {"describes_activations", describes},
                {"has_segments", !s.model->segments().empty()},
                {"one_sample", one(false).to_json()},
                {"one_sample_checkpointed", one(true).to_json()}};
      answer["state"] = state_json(state_shape(*s.model));
      // Last: the adapters change the model.
      if (config.model.lora.rank == 0 && !s.model->segments().empty()) {
        LoraConfig lora;
        lora.rank = lora_rank;
        try {
          add_lora_adapters(*s.model, lora);
          hold_shapes(*s.model, held_dtype(config, precision));
          answer["lora_state"] = state_json(state_shape(*s.model));
        } catch (const ConfigError&) {
          // No Linear layer to adapt: nothing to suggest.
        }
      }
    } catch (const c10::Error& e) {
      answer = {{"error", e.what_without_backtrace()}};
    } catch (const std::exception& e) {
      answer = {{"error", e.what()}};
    }
    const std::string text = answer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    for (size_t done = 0; done < text.size();) {
      const ssize_t n = write(fds[1], text.data() + done, text.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ModelShape shape;
  const nlohmann::json answer = nlohmann::json::parse(text, nullptr, false);
  if (!answer.is_object()) {
    shape.error = "the child building it ended without a word";
  } else if (answer.contains("error")) {
    shape.error = answer["error"].get<std::string>();
  } else {
    shape.weight_bytes = answer["weight_bytes"].get<int64_t>();
    shape.describes_activations = answer["describes_activations"].get<bool>();
    shape.has_segments = answer["has_segments"].get<bool>();
    shape.one_sample = Estimate::from_json(answer["one_sample"]);
    shape.one_sample_checkpointed = Estimate::from_json(answer["one_sample_checkpointed"]);
    shape.state = state_from_json(answer["state"]);
    if (answer.contains("lora_state")) shape.lora_state = state_from_json(answer["lora_state"]);
  }
  return shape;
}

namespace {
/// Whether the smallest step a plan can choose is checkpointed.
bool smallest_checkpoints(const RunConfig& config, const ModelShape& shape) {
  return shape.has_segments && may_checkpoint(memory_strategy(config.memory.strategy));
}
}  // namespace

Estimate smallest_step(const RunConfig& config, const ModelShape& shape) {
  return smallest_checkpoints(config, shape) ? shape.one_sample_checkpointed : shape.one_sample;
}

namespace {

/// "the smallest card that fits: A100 40GB (37.25 GiB)" for `need` bytes with memory.headroom,
/// from the bundled table (examples/cards.yaml), or that none of it does.
std::string card_advice(const RunConfig& config, int64_t need) {
  const std::string card = smallest_card_for(bundled_cards(), need, config.memory.headroom);
  return card.empty() ? "no card of the bundled table (examples/cards.yaml) is large enough"
                      : "the smallest card that fits: " + card;
}

/// Throws RunDoesNotFit when the smallest step exceeds the usable capacity by the estimate.
void require_fit_by_estimate(const RunConfig& config, const ModelShape& shape,
                             int64_t capacity_bytes, Precision precision, int64_t world_size) {
  PlanRequest request;
  request.capacity_bytes = capacity_bytes;
  request.headroom = config.memory.headroom;
  const int64_t usable = usable_bytes(request);
  // Under the placement the run would take (sharded when only that fits); an offload the host
  // cannot hold is refused here, before a weight is built.
  const Estimate e = place_optimizer(config, shape.state, smallest_step(config, shape), precision,
                                     world_size, capacity_bytes)
                         .smallest;
  if (!exceeds_by_estimate(e, usable)) return;
  const bool checkpointing = smallest_checkpoints(config, shape);
  throw RunDoesNotFit(
      "the run does not fit this device by the estimate (nothing was built or run): "
      "micro-batch 1" +
      std::string(checkpointing ? " with activation checkpointing" : "") + " needs " +
      std::to_string(e.total()) + " bytes (" + format_bytes(e.total()) +
      (shape.describes_activations ? "" : " or more: the model's activations are not counted") +
      "; parameters and buffers " + format_bytes(e.parameters) + ", gradients " +
      format_bytes(e.gradients) + ", optimizer state " + format_bytes(e.optimizer_state) +
      ", activations " + format_bytes(e.activations) + ", autocast's weight copies " +
      format_bytes(e.weight_casts) + "), the device has " + std::to_string(capacity_bytes) +
      " bytes (" + format_bytes(capacity_bytes) + ") of which " + std::to_string(usable) +
      " usable with memory.headroom " + std::to_string(config.memory.headroom) + "; " +
      card_advice(config, e.total()) + ". `gpurun plan` shows what each card needs");
}

}  // namespace

Session open_estimate_session(const RunConfig& config, const std::string& device,
                              const Registry& registry, DatasetSplits data,
                              const ModelShape& shape) {
  if (!config.model.torchscript.empty())
    throw ConfigError(
        "a TorchScript model (model.torchscript) is loaded with its weights: plan "
        "it without --estimate-only");
  Session s;
  s.device = select_device(device, 0);
  s.loss = registry.make_loss(config.train.loss);
  s.data = std::move(data);
  if (!shape.error.empty())
    throw ConfigError("model " + config.model.name + " cannot be built without its weights (" +
                      shape.error + "): plan it by running it, without --estimate-only");
  if (shape.describes_activations) {
    // Only shapes are read from here on, so the meta backend's dispatch does no harm.
    WithoutWeights without_weights;
    build_model(config, registry, s);
  } else {
    // Its layers are walked once (memory/peak_probe.h): real weights, when they fit in a
    // quarter of this machine's memory.
    const int64_t memory = physical_memory_bytes();
    if (shape.weight_bytes > memory / 4)
      throw ConfigError("model " + config.model.name + " does not describe its activations " +
                        "(SegmentedModel::set_activation_estimate), and its weights (" +
                        format_bytes(shape.weight_bytes) + ") are too large to run its layers " +
                        "once on this machine (" + format_bytes(memory) + ")");
    torch::manual_seed(static_cast<uint64_t>(config.train.seed));
    build_model(config, registry, s);
  }
  s.precision = resolve_precision(config.train.precision, s.device);
  hold_shapes(*s.model, held_dtype(config, s.precision.precision));
  return s;
}

int64_t physical_memory_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}

Session open_session(const RunConfig& config, const std::string& device, int64_t memory_limit,
                     const Registry& registry, int local_rank, const ModelShape* shape,
                     int64_t world_size) {
  Session s;
  s.resident_before_model_bytes = resident_bytes();
  s.device = select_device(device, local_rank);
  if (local_rank == 0)
    spdlog::info("device {}{}", s.device.str(),
                 device == "auto" && s.device.is_cpu() ? " (--device auto: no CUDA device)" : "");
  set_determinism(s.device, config.train.deterministic);
  s.loss = registry.make_loss(config.train.loss);
  if (config.train.threads > 0) at::set_num_threads(static_cast<int>(config.train.threads));
  // data.path and data.eval_path as run.yaml's folder resolves them (config/paths.h).
  DataConfig data = run_data(config, local_rank == 0);
  // Data in a bucket is always staged: the data sets read local files.
  if (data.stage_dir.empty() && (is_s3_url(data.path) || is_s3_url(data.eval_path)))
    data.stage_dir = default_stage_dir();
  if (!data.stage_dir.empty()) s.data_stage = stage_data(data, local_rank == 0);
  s.data = registry.make_dataset(data);
  s.precision = resolve_precision(config.train.precision, s.device);
  const int64_t limit = memory_limit_bytes(config, memory_limit);
  // Before a weight is built: a run whose smallest step exceeds the device by the estimate is
  // refused here, so that no probe can take the machine's memory. A TorchScript module is
  // loaded with its weights, and a factory that fails without them is planned as before.
  if (config.model.torchscript.empty()) {
    const ModelShape learned =
        shape ? *shape
              : probe_model_shape(config, registry, s.data, s.device, s.precision.precision);
    if (learned.error.empty())
      require_fit_by_estimate(config, learned, make_meter(s.device, limit)->capacity_bytes(),
                              s.precision.precision, placement_world_size(world_size));
  }
  torch::manual_seed(static_cast<uint64_t>(config.train.seed));
  build_model(config, registry, s);
  s.model->to(s.device);
  // The weights are copied again under the meter, so that they count as device memory, and a
  // model whose weights alone exceed the capacity is refused with what it needs.
  s.meter = make_meter(s.device, limit);
  auto tensors = state_dict(*s.model);
  // With master weights the model is held in 16 bits, its buffers and frozen parameters too,
  // as model.to(torch.bfloat16) and Megatron-core's Float16Module hold it: the fp32 copy of the
  // trainable weights is the optimizer's master slice (optim/flat_optimizer.h), and a layer
  // whose parameters and buffers differ in dtype (BatchNorm's fp32 running statistics beside
  // 16-bit weights) would be refused by its kernel.
  const std::optional<c10::ScalarType> held = held_dtype(config, s.precision.precision);
  const auto held_bytes = [&](const at::Tensor& t) {
    return held && t.is_floating_point() ? t.numel() * static_cast<int64_t>(c10::elementSize(*held))
                                         : static_cast<int64_t>(t.nbytes());
  };
  const int64_t weights =
      std::accumulate(tensors.begin(), tensors.end(), int64_t{0},
                      [&](int64_t n, const auto& e) { return n + held_bytes(e.second); });
  try {
    hold_model(*s.model, held);
  } catch (const c10::OutOfMemoryError&) {
    const int64_t need =
        weights * (config.optim.name == "sgd" && config.optim.momentum == 0 ? 2 : 4);
    throw WeightsDoNotFit("the model does not fit: its weights alone are " +
                          std::to_string(weights) + " bytes (" + format_bytes(weights) +
                          "); with gradients and optimizer "
                          "state it needs about " +
                          std::to_string(need) + " bytes, the device has " +
                          std::to_string(s.meter->capacity_bytes()) + " bytes (" +
                          format_bytes(s.meter->capacity_bytes()) + "); " +
                          card_advice(config, need));
  }
  // A Hugging Face folder's weights are checked now, before anything is written under --ckpt;
  // a fresh run copies them in before its first step (the trainer; train/hf_weights.h).
  if (config.model.name == "hf") check_hf_weights(*s.model, config_path(config, config.model.path));
  warn_about_suspicious_settings(config, s, memory_limit);
  return s;
}

DataConfig run_data(const RunConfig& config, bool log) {
  DataConfig data = resolved_data(config, log);
  // A Hugging Face model's token ids are below its config.json's vocab_size.
  if (config.model.name != "hf" || data.name != "tokens") return data;
  const int64_t vocabulary = read_hf_config(config_path(config, config.model.path)).vocabulary;
  if (data.vocab_size == 0) data.vocab_size = vocabulary;
  // A tokenizer of more than 65536 ids writes uint32: read as uint16, its file would train on
  // halves of ids without a word (an llm.c header names its own width).
  if (vocabulary > 65536 && data.dtype == "uint16") {
    int32_t magic = 0;
    std::ifstream in(data.path, std::ios::binary);
    const bool read = static_cast<bool>(in.read(reinterpret_cast<char*>(&magic), sizeof magic));
    if (read && magic != 20240520 && magic != 20240801)
      throw ConfigError("data.dtype: uint16, but the model's config.json has vocab_size " +
                        std::to_string(vocabulary) +
                        ", whose ids need uint32: set data.dtype: "
                        "uint32 (a token file of uint16 ids cannot hold this tokenizer's)");
  }
  return data;
}

PlanRequest plan_request(const RunConfig& config, const Session& session, int64_t world_size) {
  PlanRequest r;
  r.global_batch = config.train.batch_size;
  r.world_size = world_size;
  r.micro_batch = config.train.batch_size / config.train.accumulation_steps / world_size;
  r.eval_batch = config.train.eval_batch_size;
  r.capacity_bytes = session.meter->capacity_bytes();
  r.headroom = config.memory.headroom;
  r.strategy = memory_strategy(config.memory.strategy);
  r.can_checkpoint = !session.model->segments().empty();
  r.card_for = [headroom = config.memory.headroom](int64_t need) {
    return smallest_card_for(bundled_cards(), need, headroom);
  };
  return r;
}

Estimate estimate_at(const RunConfig& config, Session& session, int64_t micro_batch,
                     bool checkpointing) {
  return estimate_peak(*session.model, config.optim, session.data.input_shape, micro_batch,
                       checkpointing, session.device, session.precision.precision);
}

Estimate estimate_for(const RunConfig& config, Session& session, const MemoryPlan& plan) {
  return estimate_at(config, session, plan.micro_batch, plan.activation_checkpointing);
}

namespace {
bool has_batch_norm(const torch::nn::Module& model) {
  for (const auto& m : model.modules())
    if (m->name().find("BatchNorm") != std::string::npos) return true;
  return false;
}
}  // namespace

MemoryPlan make_plan(const RunConfig& config, Session& session, int64_t world_size,
                     const std::optional<MemoryPlan>& saved, const PlanAgreement& agree) {
  const PlanRequest request = plan_request(config, session, world_size);
  if (const std::string problem = detail::batch_split_problem(config, world_size); !problem.empty())
    throw ConfigError(problem);
  const Precision precision = session.precision.precision;
  const Estimate one_sample[2] = {estimate_at(config, session, 1, false),
                                  estimate_at(config, session, 1, true)};
  // Where the optimizer state lives, by the estimate, before any probe (memory/placement.h):
  // sharding is the lever after accumulation and checkpointing, so each placement is judged by
  // the smallest step those leave.
  const StateShape shape = state_shape(*session.model);
  const bool can_checkpoint = request.can_checkpoint && may_checkpoint(request.strategy);
  const PlacementChoice placement =
      place_optimizer(config, shape, one_sample[can_checkpoint ? 1 : 0], precision, world_size,
                      request.capacity_bytes);
  if (!placement.note.empty()) spdlog::info("{}", placement.note);
  const Estimate rank = rank_state(shape, config.optim, precision, placement.placement, world_size);
  MemoryPlan plan;
  bool reuse = saved && saved->capacity_bytes == request.capacity_bytes &&
               saved->global_batch == request.global_batch && saved->world_size == world_size &&
               saved->micro_batch > 0 && saved->precision == precision_name(precision) &&
               saved->shard == placement.placement.shard &&
               saved->offload == placement.placement.offload;
  if (agree.any) reuse = !agree.any(!reuse);
  const auto agreed = [&](Probe p) { return agree.probe ? agree.probe(p) : p; };
  if (reuse) {
    plan = *saved;
    spdlog::info("reusing the checkpoint's memory plan: micro-batch {} x accumulation {}{}",
                 plan.micro_batch, plan.accumulation_steps,
                 plan.activation_checkpointing ? ", activation checkpointing" : "");
  } else {
    if (saved && saved->capacity_bytes != request.capacity_bytes)
      spdlog::warn("device capacity changed ({} -> {}): planning again, global batch kept",
                   format_bytes(saved->capacity_bytes), format_bytes(request.capacity_bytes));
    if (saved && saved->world_size != world_size)
      spdlog::info("world size changed ({} -> {}): planning again, global batch {} kept",
                   saved->world_size, world_size, request.global_batch);
    Prober prober(*session.model, session.data, config.optim, *session.meter,
                  config.memory.probe_steps, session.device, session.loss, precision);
    prober.set_placement(placement.placement, world_size);
    const int64_t usable = usable_bytes(request);
    const auto train_probe = [&](int64_t m, bool c) {
      // A stop signal ends the planning between probes (every rank at the same probe): before
      // the first step there is nothing to save, and a checkpoint being resumed stays as it is.
      const int sig = stop_signal();
      if (agree.any ? agree.any(sig != 0) : sig != 0) throw Stopped(sig ? sig : SIGTERM);
      // A step holds at most the training set, as the probe does (a batch beyond it is one
      // step of the whole set an epoch).
      const Estimate e = one_sample[c ? 1 : 0].with_state(rank).at_micro_batch(
          std::min(m, session.data.train->size()));
      const std::string what =
          "micro-batch " + std::to_string(m) + (c ? " with activation checkpointing" : "");
      if (exceeds_by_estimate(e, usable)) {
        // Identical on every rank: no collective is skipped by one rank alone.
        spdlog::info("{}: not probed, its estimate {} exceeds the {} usable", what,
                     format_bytes(e.total()), format_bytes(usable));
        Probe p;
        p.micro_batch = m;
        p.checkpointing = c;
        p.peak_bytes = e.total();
        p.estimated = true;
        return p;
      }
      spdlog::info("probing {} ({} steps, estimated {})", what, config.memory.probe_steps,
                   format_bytes(e.total()));
      Probe p = agreed(prober.train(m, c));
      p.estimated_bytes = e.total();
      if (p.out_of_memory)
        spdlog::info("{}: out of memory", what);
      else
        spdlog::info("{}: peak {}, {:.3f} s per micro-batch", what, format_bytes(p.peak_bytes),
                     p.step_seconds);
      return p;
    };
    plan = choose_plan(
        request, train_probe,
        [&](int64_t b, const MemoryPlan& p) { return agreed(prober.eval(b, p)); },
        [&](const MemoryPlan& p) {
          CheckpointProbes c = prober.checkpoint(p);
          c.capture = agreed(c.capture);
          c.resume = agreed(c.resume);
          return c;
        });
  }
  plan.precision = precision_name(precision);
  plan.shard = placement.placement.shard;
  plan.offload = placement.placement.offload;
  plan.shard_reason = placement.reason;
  plan.host_bytes = placement.smallest.host_bytes;
  const Estimate estimate = estimate_for(config, session, plan).with_state(rank);
  plan.estimated_peak_bytes = estimate.total();
  plan.estimate = estimate.to_json();
  plan.capacity_bytes = request.capacity_bytes;
  checkpoint_every_segment(*session.model, plan.activation_checkpointing);
  if (plan.micro_batch < 16 && has_batch_norm(*session.model))
    spdlog::warn(
        "the model has BatchNorm and the micro-batch is {}: its statistics are computed "
        "per micro-batch, so results differ from micro-batch {} (consider GroupNorm)",
        plan.micro_batch, request.micro_batch);
  return plan;
}

PlanAgreement plan_agreement(Collectives* comm) {
  PlanAgreement a;
  if (!comm) return a;
  a.probe = [comm](const Probe& p) {
    Probe worst = p;
    const auto v = comm->all_reduce(
        {static_cast<double>(p.peak_bytes), p.out_of_memory ? 1.0 : 0.0, p.step_seconds},
        Collectives::Op::kMax);
    worst.peak_bytes = static_cast<int64_t>(v[0]);
    worst.out_of_memory = v[1] > 0;
    worst.step_seconds = v[2];
    return worst;
  };
  a.any = [comm](bool mine) {
    return comm->all_reduce({mine ? 1.0 : 0.0}, Collectives::Op::kMax)[0] > 0;
  };
  return a;
}

void log_plan(const RunConfig& config, const Session& session, const MemoryPlan& plan) {
  const ParameterCounts counts = count_parameters(*session.model);
  spdlog::info("precision {} ({}); parameters: {} trainable of {} ({:.1f}%){}",
               precision_name(session.precision.precision), session.precision.reason,
               counts.trainable, counts.total,
               counts.total ? 100.0 * static_cast<double>(counts.trainable) / counts.total : 0.0,
               session.lora_layers.empty()
                   ? ""
                   : ", LoRA rank " + std::to_string(config.model.lora.rank) + " on " +
                         std::to_string(session.lora_layers.size()) + " Linear layers");
  const int64_t measured = plan.measured_peak_bytes, estimated = plan.estimated_peak_bytes;
  spdlog::info(
      "memory plan: micro-batch {} x accumulation {} x world {} = global batch {}{}; "
      "eval batch {} ({})",
      plan.micro_batch, plan.accumulation_steps, plan.world_size, plan.global_batch,
      plan.activation_checkpointing ? ", activation checkpointing" : "", plan.eval_batch,
      plan.reason);
  OptimizerPlacement placement;
  placement.shard = plan.shard;
  placement.master_weights = uses_master_weights(config, session.precision.precision);
  placement.offload = plan.offload;
  spdlog::info("optimizer placement: {} over {} rank{} ({}){}", placement_name(placement),
               plan.world_size, plan.world_size == 1 ? "" : "s", plan.shard_reason,
               plan.offload ? "; " + format_bytes(plan.host_bytes) + " of host memory a rank"
                            : std::string());
  // The estimate models a training step, so it is compared with the training steps' part.
  const int64_t training = plan.measured.training > 0 ? plan.measured.training : measured;
  const std::string parts = plan.measured.to_string();
  spdlog::info("peak memory: measured {}{}; estimated training step {} ({:+.0f}%); capacity {}",
               format_bytes(measured), parts.empty() ? "" : " (" + parts + ")",
               format_bytes(estimated),
               training > 0 ? 100.0 * (estimated - training) / training : 0.0,
               format_bytes(plan.capacity_bytes));
}

}  // namespace gpurun

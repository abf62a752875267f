// run.yaml: parsing, validation, defaults, --set overrides, and the config hash.
//
// The flow follows LibTorch's DataLoaderOptions -> FullDataLoaderOptions: load_config() reads
// the YAML file and applies the --set overrides, checks every dotted key against one schema
// (config/schema.cpp), fills the defaults and returns the typed RunConfig that the rest of
// gpurun reads; format_resolved() prints it once at the start of a run. Every error names the
// file, line, key and value.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gpurun {

/// model.lora: low-rank adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
/// Models") on the Linear layers named by `targets`; every other parameter is frozen. Each
/// targeted weight W [out, in] trains as W + B A (alpha / rank), A [rank, in] and B [out, rank].
struct LoraConfig {
  int64_t rank = 0;                       ///< rank r of the adapters; 0: off
  double alpha = 8;                       ///< the adapters' output is scaled by alpha / rank
  double dropout = 0;                     ///< probability an input feature of an adapter is dropped
  std::vector<std::string> targets{"*"};  ///< fnmatch patterns over Linear modules' names
};

struct ModelConfig {
  std::string name = "cnn";  ///< registry name: mlp, cnn, resnet, gpt, hf, or a plugin's
  /// hf: a Hugging Face model folder as save_pretrained writes it (config.json, and
  /// model.safetensors or shards listed by model.safetensors.index.json); relative like plugin.
  /// A fresh run starts from its weights; `gpurun plan` needs config.json alone. "": none.
  std::string path;
  std::vector<int64_t> hidden{256, 128};  ///< mlp: widths of the hidden layers
  std::vector<int64_t> channels{32,
                                64};  ///< cnn: channels of each conv block; resnet: of each stage
  double dropout = 0.0;               ///< probability in [0, 1)
  bool batch_norm = false;            ///< cnn: BatchNorm after every convolution
  /// A plugin .so (plugin.h) registering model.name; relative paths resolve against the
  /// directory of the run.yaml (config_path()). "": none.
  std::string plugin;
  /// A TorchScript module file (torch.jit.script(m).save(...)) trained as the model; relative
  /// like plugin. Sets model.name to "torchscript". "": none.
  std::string torchscript;
  std::vector<int64_t> blocks{2, 2};  ///< resnet: residual blocks of each stage
  int64_t layers = 4;                 ///< gpt: transformer blocks
  int64_t heads = 4;                  ///< gpt: attention heads; divides width
  int64_t width = 128;                ///< gpt: embedding width
  int64_t context = 0;                ///< gpt: longest sequence (positions); 0: the data's
  /// Parameters that get no gradient and no optimizer state: fnmatch(3) patterns over the
  /// dotted parameter names, without FNM_PATHNAME, so `*` also crosses dots ("block0.*").
  std::vector<std::string> freeze;
  /// A state_dict loaded before step 0 of a fresh run: a Python torch.save of a name -> tensor
  /// dict, a `gpurun export`, or a checkpoint's model.pt; relative like plugin. A resume
  /// ignores it (the checkpoint wins). "": none.
  std::string init_from;
  /// init_from: true, every tensor of the model must be in the file with its shape and nothing
  /// else may be; false, load what matches and list the rest.
  bool init_strict = true;
  LoraConfig lora;
};

/// data.workers and data.prefetch: `auto`, held as -1 (every other value is a number >= 0).
inline constexpr int64_t kAutoCount = -1;

struct DataConfig {
  /// registry name: idx, csv, text, image_folder, tokens, synthetic, or a plugin's
  std::string name = "idx";
  /// idx, image_folder: directory; csv, text, tokens: file. Relative: beside run.yaml
  /// (config/paths.h).
  std::string path = "/usr/share/datasets/fashion-mnist";
  int64_t train_samples = 0;  ///< 0: all; otherwise the first N training samples
  int64_t eval_samples = 0;   ///< 0: all; otherwise the first N test samples
  /// csv, text, tokens: evaluation file; image_folder: folder (relative: beside run.yaml)
  std::string eval_path;
  /// csv, text, tokens, image_folder, synthetic: share held out when there is no eval_path
  double eval_fraction = 0.1;
  std::string label = "-1";     ///< csv: label column, header name or 0-based index (<0: from end)
  bool header = true;           ///< csv: the first row names the columns
  std::string delimiter = ",";  ///< csv: one character; "\t" or "tab" for tab
  int64_t context = 64;         ///< text: characters per sample; tokens: tokens per sample
  int64_t stride = 0;           ///< text: characters between sample starts; 0: context
  /// tokens: uint16 | uint32, the width of a raw file's token ids (an llm.c header names its own)
  std::string dtype = "uint16";
  /// tokens: token ids are in [0, vocab_size); 0: the llm.c header's tokenizer (GPT-2: 50257,
  /// Llama 3: 128256); a raw file needs it set
  int64_t vocab_size = 0;
  /// tokens: random (each sample's offset drawn from its sample_seed) | sequential
  /// (non-overlapping windows, each token once per epoch)
  std::string windows = "random";
  /// tokens: a loss mask beside the token file, one uint8 per token of data.path (after an
  /// llm.c header's tokens, none for the header): 1 where the token counts as a target, 0 where
  /// it does not (a prompt's tokens in supervised fine-tuning). The loss and accuracy average
  /// over the counted targets only. Relative like data.path. "": every target counts.
  std::string mask_path;
  /// tokens: the mask of the evaluation tokens (data.eval_path, or val.bin beside data.path);
  /// with data.eval_fraction splitting data.path, data.mask_path's tail. "": every target counts.
  std::string eval_mask_path;
  int64_t samples = 1024;                 ///< synthetic: samples generated (both splits)
  std::vector<int64_t> shape{1, 28, 28};  ///< synthetic: shape of one sample
  int64_t classes = 10;                   ///< synthetic: number of classes
  int64_t seed = 0;  ///< synthetic: the data; csv, image_folder: the shuffle before the split
  /// image_folder (data/image_folder.h): the side in pixels of the square samples, [C, S, S].
  int64_t image_size = 224;
  int64_t channels = 3;  ///< image_folder: 1 (grayscale) or 3 (RGB), converted on decode
  /// image_folder: training transform. standard: RandomResizedCrop + RandomHorizontalFlip;
  /// none: the evaluation transform (Resize + CenterCrop).
  std::string augment = "standard";
  /// image_folder: per-channel mean and standard deviation of pixels in [0, 1], one value or
  /// one per channel. Empty: ImageNet's for 3 channels, 0.5 for 1.
  std::vector<double> mean;
  std::vector<double> std;
  /// image_folder: a file that does not decode is skipped (counted, logged once) instead of
  /// ending the run.
  bool skip_bad = false;
  /// A local disk that path and eval_path are copied to before training, and read from
  /// (data/data_stage.h); a relative path resolves against the working directory, as
  /// --ckpt does (a place written, not an input). "": off.
  std::string stage_dir;
  /// Loader threads that fetch the coming batches ahead of the training step (data/loader.h);
  /// 0: each batch is fetched on the training thread when it is needed. kAutoCount (`auto`):
  /// what the cores leave beside training, at most 4 (resolve_workers() in data/loader.h).
  /// Never changes what is learned: a batch's contents depend on its place in the epoch alone.
  int64_t workers = kAutoCount;
  /// Batches kept ready ahead of the training step, all workers together; kAutoCount (`auto`):
  /// 2 per worker. Unused with workers 0.
  int64_t prefetch = kAutoCount;
};

struct OptimConfig {
  std::string name = "adam";  ///< sgd | adam | adamw
  double lr = 1e-3;
  double momentum = 0.0;  ///< sgd
  bool nesterov = false;  ///< sgd; needs momentum > 0
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  ///< adam, adamw
  double grad_clip = 0.0;                         ///< max global L2 norm of the gradients; 0: off
  /// With train.precision bf16 or fp16: the model's weights (and gradients) are held in that
  /// dtype and the optimizer keeps an fp32 master copy of the trainable ones, sharded with its
  /// state (optim/flat_optimizer.h). false: fp32 weights, autocast casts them per pass.
  bool master_weights = false;
  /// none | host | auto: where the optimizer's state, master weights and step live. host: in
  /// (pinned, on CUDA) host memory, the step on the CPU (ZeRO-Offload, Ren et al. 2021). auto:
  /// host only when the run fits no other way; never chosen when none.
  std::string offload = "none";
};

struct ScheduleConfig {
  std::string name = "constant";  ///< constant | step | cosine
  int64_t warmup_steps = 0;       ///< linear warm-up from lr/warmup_steps to lr, optimizer steps
  int64_t step_size = 1000;       ///< step: multiply by gamma every step_size optimizer steps
  double gamma = 0.1;
  double min_lr = 0.0;  ///< cosine: the floor reached at the last optimizer step
};

/// A metric of the `epoch` event that keep_best and early_stop rank epochs by.
/// mode: min | max | auto; auto resolves to max for eval_accuracy and min for the losses
/// (config.cpp), so the resolved config always says min or max.
struct MetricGoal {
  std::string metric;         ///< eval_loss | eval_accuracy | train_loss; "": off
  std::string mode = "auto";  ///< min | max | auto
};

/// train.early_stop: stop once `metric` has not improved by more than min_delta for `patience`
/// epochs in a row (Lightning's EarlyStopping(monitor, mode, patience, min_delta)). The
/// counter travels in the checkpoint, so a resumed run stops at the epoch an uninterrupted one
/// does (train/early_stop.h).
struct EarlyStopConfig : MetricGoal {
  int64_t patience = 3;  ///< epochs without improvement before the stop
  double min_delta = 0;  ///< an improvement must beat the best by more than this
};

struct TrainConfig {
  int64_t epochs = 1;
  int64_t batch_size = 64;         ///< global batch: samples per optimizer step, all ranks
  int64_t accumulation_steps = 1;  ///< micro-batches per optimizer step and rank
  int64_t eval_batch_size = 256;
  int64_t seed = 0;
  int64_t threads = 0;                 ///< intra-op threads; 0: LibTorch's default
  std::string loss = "cross_entropy";  ///< registry name of the loss (loss.h)
  /// fp32 | bf16 | fp16 | auto: the autocast dtype of the forward pass (model/precision.h);
  /// fp16 trains with a gradient scaler. auto: bf16 where the device has it, else fp16 on
  /// CUDA, else fp32.
  std::string precision = "fp32";
  /// On CUDA: deterministic cuBLAS (CUBLAS_WORKSPACE_CONFIG) and cuDNN algorithms, so that a
  /// resumed run is bit-identical to an uninterrupted one; off trades that for speed.
  bool deterministic = true;
  EarlyStopConfig early_stop;
};

/// Text generated after every epoch by a model of token data (data text with model gpt, or
/// any dataset with class_names whose model gives [B, T, vocabulary] logits).
struct SampleConfig {
  int64_t length = 200;    ///< characters generated; 0: off
  std::string prompt;      ///< the start; empty: the first characters of the evaluation text
  double temperature = 0;  ///< 0: greedy (arg-max); > 0: sample softmax(logits / temperature)
  int64_t seed = 0;        ///< seed of the sampling generator (separate from training's)
};

/// checkpoint.every_minutes: auto, held as a NaN (every other value is a number >= 0).
inline constexpr double kAutoInterval = std::numeric_limits<double>::quiet_NaN();

/// checkpoint.keep_best: the k epoch checkpoints with the best `metric` are never deleted by
/// retention (Lightning's ModelCheckpoint(monitor, save_top_k), Ray's num_to_keep with
/// checkpoint_score_attribute); keep_last keeps the newest ones beside them
/// (checkpoint/storage/retention.h).
struct KeepBestConfig : MetricGoal {
  int64_t k = 1;  ///< best checkpoints kept
};

struct CheckpointConfig {
  int64_t every_steps = 0;  ///< also save every N optimizer steps; 0: only per epoch
  /// Also save every N minutes; 0: off; kAutoInterval (`auto`): the Young/Daly interval from
  /// the measured save cost and mtbf_hours (checkpoint/interval.h).
  double every_minutes = 0;
  double mtbf_hours = 6;      ///< mean time between failures (reclaims) that `auto` assumes
  int64_t keep_last = 3;      ///< complete checkpoints kept; the newest is never deleted
  double grace_seconds = 25;  ///< time a signal leaves us to save and exit
  double lease_timeout = 60;  ///< seconds after which a silent lease is stale
  bool async = true;          ///< write in a background thread while training goes on
  int64_t max_failures = 3;   ///< failed saves in a row before the run stops (exit 1)
  /// A local disk in front of --ckpt (network storage): every save is complete there first and
  /// copied to --ckpt in the background (docs/architecture.md, "Checkpoint tiers"). A relative
  /// path resolves against the working directory, as --ckpt does. "": off.
  std::string local_dir;
  int64_t local_keep_last = 2;  ///< complete checkpoints kept in the local tier
  KeepBestConfig keep_best;
};

/// How gpurun fits the run to the device's memory (memory_plan.h).
struct MemoryConfig {
  std::string capacity = "auto";  ///< "auto" (the device's size) or a SIZE like "24GiB"
  double headroom = 0.1;          ///< fraction of the capacity left free, in [0, 1)
  std::string strategy = "auto";  ///< auto | accumulate | checkpoint | none
  int64_t probe_steps = 3;        ///< measured training steps per probed configuration
};

struct LogConfig {
  int64_t every_steps = 10;  ///< a `step` event every N optimizer steps
};

/// Distributed runs (--nproc-per-node, --nnodes, Slurm).
struct DistributedConfig {
  /// Seconds the rendezvous and every collective may wait for the other ranks before the run
  /// fails (and the launcher restarts it); also bounds how long a rank waits at a barrier
  /// while rank 0 finishes writing a checkpoint.
  double timeout = 300;
  /// none | optimizer | gradients | auto (optim/flat_optimizer.h). optimizer: each rank keeps
  /// the optimizer state (and master weights) of its 1/N slice of the trainable parameters
  /// only (ZeRO stage 1); gradients: also releases the full gradients once reduced (stage 2).
  /// auto: none when the run fits replicated, else the first mode that fits.
  std::string shard = "auto";
};

/// The cloud's preemption notices (launch/notice_watcher.h): a thread of the training process
/// polls the instance's metadata service and stops the run as a stop signal would, early.
struct PreemptionConfig {
  /// auto | aws | gcp | azure | none. auto: the cloud the machine's DMI names
  /// (/sys/class/dmi/id), none off a cloud, where no request is ever sent.
  std::string watch = "auto";
  /// Seconds between polls; AWS advises 5 for its spot notices, which give 2 minutes.
  double poll_seconds = 5;
};

/// Messages about the run to a person who is not watching (notify/notifier.h; README
/// "Notifications"): a JSON POST to a webhook and/or a command fed the same JSON on stdin.
struct NotifyConfig {
  /// http:// or https:// URL of a webhook (Slack, Discord, ntfy, your own), or $NAME: the URL in
  /// the environment variable NAME. It may hold a secret: it is never logged, never written to
  /// an event, status.json or a manifest. "": no POST.
  std::string url;
  /// The events sent: started, checkpoint_failed, preempted, stalled, failed, finished, budget.
  std::vector<std::string> on{"started", "checkpoint_failed", "preempted", "stalled",
                              "failed",  "finished",          "budget"};
  /// A shell command run with the message's JSON on stdin (e.g. `sendmail -t` behind a
  /// script); "": none.
  std::string command;
};

/// The money a run costs (train/cost_ledger.h; README "Cost and budget").
struct CostConfig {
  /// Price of one rank's device per hour (a card-hour, as price_per_hour in the cards file),
  /// in your currency; the run's rate is this times the world size. 0: the price of the
  /// bundled cards file's card that the device's name matches, else unknown (time only).
  double price_per_hour = 0;
  /// Stop (save, exit 4) before the spend passes it; 0: no budget. A resume goes on only with
  /// a larger one.
  double budget = 0;
  /// A shell command run once a run has finished or stopped at its budget, after its final
  /// checkpoint is safe in --ckpt (e.g. `sudo poweroff`); "": none.
  std::string stop_command;
};

/// The resolved configuration: every default filled in, every value checked.
struct RunConfig {
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainConfig train;
  CheckpointConfig checkpoint;
  MemoryConfig memory;
  LogConfig log;
  DistributedConfig distributed;
  SampleConfig sample;
  PreemptionConfig preemption;
  NotifyConfig notify;
  CostConfig cost;
  std::string source;  ///< the file it came from, for messages
  /// The directory relative paths in the config resolve against (config_path()): the run.yaml's
  /// directory for load_config, "" (the current directory) otherwise. Not a config key.
  std::string base_dir;
};

/// `path` from a config key: unchanged when empty or absolute, otherwise joined to
/// config.base_dir (the run.yaml's directory), so a config and the files beside it can move
/// together; --set values are resolved the same way.
std::string config_path(const RunConfig& config, const std::string& path);

/// Reads `path` and applies `overrides` ("train.epochs=3", later ones win) on top.
/// Throws ConfigError naming file:line, key and value for an unknown key (with the nearest
/// valid key suggested), a wrong type, or an out-of-range value; and for an unreadable file.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});

/// Same as load_config, from YAML text already in memory (`source_name` is used in messages).
RunConfig parse_config(const std::string& yaml_text, const std::string& source_name,
                       const std::vector<std::string>& overrides = {});

/// The resolved config as JSON, nested by section (stored in every manifest).
nlohmann::json config_to_json(const RunConfig& config);

/// Inverse of config_to_json; throws ConfigError on a malformed object.
RunConfig config_from_json(const nlohmann::json& j);

/// The keys that change what is learned: every key of model, data, optim, schedule and train
/// except train.epochs (docs/architecture.md, "Manifest"). Dotted names, sorted.
std::vector<std::string> training_keys();

/// xxh3-64 in hex over the canonical JSON of training_keys()' values.
std::string config_hash(const RunConfig& config);

/// Dotted keys whose training-relevant values differ between `a` and `b`, as
/// "optim.lr: 0.001 -> 0.01"; empty when the hash would be equal.
std::vector<std::string> changed_training_keys(const RunConfig& a, const RunConfig& b);

/// The resolved config as an aligned, human-readable block of "key  value" lines.
std::string format_resolved(const RunConfig& config);

/// Every config key, one line each: name, default, accepted values and what it does, from the
/// schema (the test of the schema's help texts reads it).
std::string format_config_keys();

}  // namespace gpurun

#include "config/schema.h"

namespace gpurun::detail {
namespace {

Limit any() { return {}; }
Limit at_least(double lo) { return {lo, kInf, false, false, false, false, {}}; }
Limit between(double lo, double hi) { return {lo, hi, false, false, false, false, {}}; }
Limit above(double lo) { return {lo, kInf, true, false, false, false, {}}; }
Limit fraction() { return {0, 1, false, true, false, false, {}}; }      // [0, 1)
Limit open_fraction() { return {0, 1, true, true, false, false, {}}; }  // (0, 1)
Limit non_empty() { return {-kInf, kInf, false, false, true, false, {}}; }
Limit positive_ints() { return {1, kInf, false, false, true, false, {}}; }  // non-empty, each >= 1
Limit one_of(std::vector<std::string> choices) {
  return {-kInf, kInf, false, false, true, false, std::move(choices)};
}
/// An epoch event's metric that keep_best and early_stop rank by, or "": off.
Limit metric() {
  Limit l = one_of({"eval_loss", "eval_accuracy", "train_loss"});
  l.non_empty = false;
  return l;
}
/// A number >= lo, or the word `auto` (checkpoint.every_minutes; data.workers, held as
/// kAutoCount).
Limit at_least_or_auto(double lo) {
  Limit l = at_least(lo);
  l.word = "auto";
  return l;
}
/// A SIZE key (e.g. memory.capacity: "24GiB" or "auto").
Limit size_or(std::vector<std::string> words) {
  Limit l = one_of(std::move(words));
  l.size = true;
  return l;
}

std::vector<std::string> notify_events() { return NotifyConfig().on; }

constexpr bool kHashed = true;  // changes what is learned: part of config_hash
constexpr bool kNotHashed = false;

}  // namespace

// Expands to the key's dotted name and its accessor, so a key is named once.
// clang-format off
#define GPURUN_KEY(section, member) \
  #section "." #member, [](RunConfig& c) -> Field { return &c.section.member; }
#define GPURUN_KEY3(section, group, member) \
  #section "." #group "." #member, [](RunConfig& c) -> Field { return &c.section.group.member; }

/// The schema: one line per key, in the order format_resolved() prints them. To add a key,
/// add the member to its struct in config.h and one line here; a new section is new lines.
const std::vector<Key>& schema() {
  static const std::vector<Key> kSchema = {
    {GPURUN_KEY(model, name), non_empty(), "registry name: mlp, cnn, resnet, gpt, hf, or a plugin's", kHashed},
    // Where the folder is, not what it holds: a resume (on a new box, the folder mounted
    // elsewhere) compares its config.json with the checkpoint's; its weights are read by a
    // fresh run alone, and recorded with a hash of their headers.
    {GPURUN_KEY(model, path), any(), "hf: a Hugging Face model folder (config.json, *.safetensors); relative to run.yaml", kNotHashed},
    {GPURUN_KEY(model, hidden), positive_ints(), "mlp: widths of the hidden layers", kHashed},
    {GPURUN_KEY(model, channels), positive_ints(), "cnn: channels of each conv block; resnet: of each stage", kHashed},
    {GPURUN_KEY(model, dropout), fraction(), "dropout probability", kHashed},
    {GPURUN_KEY(model, batch_norm), any(), "cnn: BatchNorm after every convolution", kHashed},
    {GPURUN_KEY(model, plugin), any(), "a plugin .so registering model.name; relative to run.yaml", kHashed},
    {GPURUN_KEY(model, torchscript), any(), "a TorchScript module file to train; relative to run.yaml", kHashed},
    {GPURUN_KEY(model, blocks), positive_ints(), "resnet: residual blocks of each stage", kHashed},
    {GPURUN_KEY(model, layers), at_least(1), "gpt: transformer blocks", kHashed},
    {GPURUN_KEY(model, heads), at_least(1), "gpt: attention heads; must divide model.width", kHashed},
    {GPURUN_KEY(model, width), at_least(1), "gpt: embedding width", kHashed},
    {GPURUN_KEY(model, context), at_least(0), "gpt: longest sequence; 0: data.context", kHashed},
    {GPURUN_KEY(model, freeze), any(), "parameters not trained: fnmatch patterns over their names (* crosses dots)", kHashed},
    // Only a fresh run reads it: a resume takes every weight from the checkpoint.
    {GPURUN_KEY(model, init_from), any(), "state_dict file loaded before step 0 of a fresh run; relative to run.yaml", kNotHashed},
    {GPURUN_KEY(model, init_strict), any(), "init_from: every tensor must match by name and shape", kNotHashed},
    {GPURUN_KEY3(model, lora, rank), at_least(0), "LoRA adapters' rank; 0: off", kHashed},
    {GPURUN_KEY3(model, lora, alpha), above(0), "LoRA: adapters scaled by alpha / rank", kHashed},
    {GPURUN_KEY3(model, lora, dropout), fraction(), "LoRA: dropout of the adapters' input features", kHashed},
    {GPURUN_KEY3(model, lora, targets), non_empty(), "LoRA: fnmatch patterns over Linear layers' names", kHashed},
    {GPURUN_KEY(data, name), non_empty(), "registry name: idx, csv, text, image_folder, tokens, synthetic, or a plugin's", kHashed},
    {GPURUN_KEY(data, path), any(), "idx: directory of the files; csv, text, tokens: the file; image_folder: a folder per class; relative to run.yaml", kHashed},
    {GPURUN_KEY(data, train_samples), at_least(0), "first N training samples; 0: all", kHashed},
    {GPURUN_KEY(data, eval_samples), at_least(0), "first N test samples; 0: all", kHashed},
    {GPURUN_KEY(data, eval_path), any(), "csv, text, tokens: evaluation file; image_folder: folder; relative to run.yaml; empty: split data.path (tokens: val.bin beside it first)", kHashed},
    // Where the bytes are read from, not which bytes: a staged copy is verified to be the same.
    {GPURUN_KEY(data, stage_dir), any(), "local disk the data files are copied to first, relative to the working directory; empty: off", kNotHashed},
    // How the batches are fetched, not which: contents depend on (seed, epoch, position) alone.
    {GPURUN_KEY(data, workers), at_least_or_auto(0), "loader threads fetching batches ahead; 0: on the training thread; auto: the cores left beside training, at most 4", kNotHashed},
    {GPURUN_KEY(data, prefetch), at_least_or_auto(1), "batches kept ready ahead, all workers together; auto: 2 per worker", kNotHashed},
    {GPURUN_KEY(data, eval_fraction), open_fraction(), "csv, text, tokens, image_folder, synthetic: share held out for evaluation", kHashed},
    {GPURUN_KEY(data, label), non_empty(), "csv: label column, name or 0-based index (<0: from the end)", kHashed},
    {GPURUN_KEY(data, header), any(), "csv: the first row names the columns", kHashed},
    {GPURUN_KEY(data, delimiter), non_empty(), "csv: one character, or \\t / tab", kHashed},
    {GPURUN_KEY(data, context), at_least(1), "text: characters per sample; tokens: tokens per sample", kHashed},
    {GPURUN_KEY(data, stride), at_least(0), "text: characters between samples; 0: context", kHashed},
    {GPURUN_KEY(data, dtype), one_of({"uint16", "uint32"}), "tokens: width of a raw file's token ids", kHashed},
    {GPURUN_KEY(data, vocab_size), at_least(0), "tokens: ids are below it; 0: the llm.c header's tokenizer's", kHashed},
    {GPURUN_KEY(data, windows), one_of({"random", "sequential"}), "tokens: random offsets, or non-overlapping windows once per epoch", kHashed},
    {GPURUN_KEY(data, mask_path), any(), "tokens: loss mask, one uint8 per token, 1 where the target counts; relative to run.yaml; empty: all count", kHashed},
    {GPURUN_KEY(data, eval_mask_path), any(), "tokens: the evaluation tokens' loss mask; relative to run.yaml; empty: all count", kHashed},
    {GPURUN_KEY(data, samples), at_least(2), "synthetic: samples generated, both splits", kHashed},
    {GPURUN_KEY(data, shape), positive_ints(), "synthetic: shape of one sample", kHashed},
    {GPURUN_KEY(data, classes), at_least(2), "synthetic: number of classes", kHashed},
    {GPURUN_KEY(data, seed), any(), "synthetic: the data; csv, image_folder: the shuffle before the split", kHashed},
    {GPURUN_KEY(data, image_size), at_least(1), "image_folder: side of the square samples, pixels", kHashed},
    {GPURUN_KEY(data, channels), at_least(1), "image_folder: 1 (grayscale) or 3 (RGB)", kHashed},
    {GPURUN_KEY(data, augment), one_of({"standard", "none"}), "image_folder: standard (random resized crop, flip) | none", kHashed},
    {GPURUN_KEY(data, mean), any(), "image_folder: per-channel mean of [0, 1] pixels; empty: ImageNet's (RGB), 0.5 (gray)", kHashed},
    {GPURUN_KEY(data, std), above(0), "image_folder: per-channel std; empty: ImageNet's (RGB), 0.5 (gray)", kHashed},
    // Which samples are learned from changes only when a file is bad, and then the count is logged.
    {GPURUN_KEY(data, skip_bad), any(), "image_folder: skip a file that does not decode instead of failing", kHashed},
    {GPURUN_KEY(optim, name), one_of({"sgd", "adam", "adamw"}), "optimizer", kHashed},
    {GPURUN_KEY(optim, lr), above(0), "learning rate", kHashed},
    {GPURUN_KEY(optim, momentum), fraction(), "sgd: momentum", kHashed},
    {GPURUN_KEY(optim, nesterov), any(), "sgd: Nesterov momentum; needs momentum > 0", kHashed},
    {GPURUN_KEY(optim, weight_decay), at_least(0), "L2 penalty (adamw: decoupled)", kHashed},
    {GPURUN_KEY(optim, beta1), fraction(), "adam, adamw: first moment decay", kHashed},
    {GPURUN_KEY(optim, beta2), fraction(), "adam, adamw: second moment decay", kHashed},
    {GPURUN_KEY(optim, eps), above(0), "adam, adamw: denominator term", kHashed},
    {GPURUN_KEY(optim, grad_clip), at_least(0), "max global L2 norm of gradients; 0: off", kHashed},
    // 16-bit weights round differently from fp32 ones: what is learned changes.
    {GPURUN_KEY(optim, master_weights), any(), "bf16, fp16: 16-bit weights, fp32 master copy in the optimizer", kHashed},
    // Where the state lives, not what it is.
    {GPURUN_KEY(optim, offload), one_of({"none", "host", "auto"}), "optimizer state and step in host memory: none | host | auto", kNotHashed},
    {GPURUN_KEY(schedule, name), one_of({"constant", "step", "cosine"}), "lr schedule", kHashed},
    {GPURUN_KEY(schedule, warmup_steps), at_least(0), "linear warm-up, optimizer steps", kHashed},
    {GPURUN_KEY(schedule, step_size), at_least(1), "step: optimizer steps per decay", kHashed},
    {GPURUN_KEY(schedule, gamma), above(0), "step: lr factor per decay", kHashed},
    {GPURUN_KEY(schedule, min_lr), at_least(0), "cosine: lr at the last step", kHashed},
    // At most 1e9: the run's optimizer steps (epochs x steps an epoch) must fit in 64 bits.
    {GPURUN_KEY(train, epochs), between(1, 1e9), "passes over the training set", kNotHashed},
    {GPURUN_KEY(train, batch_size), at_least(1), "samples per optimizer step, all ranks", kHashed},
    {GPURUN_KEY(train, accumulation_steps), at_least(1), "micro-batches per step", kHashed},
    {GPURUN_KEY(train, eval_batch_size), at_least(1), "samples per evaluation batch", kHashed},
    {GPURUN_KEY(train, seed), any(), "seed of weights, shuffling and dropout", kHashed},
    // The manifest records threads on their own; a different count only warns on resume.
    {GPURUN_KEY(train, threads), at_least(0), "intra-op threads; 0: LibTorch's", kNotHashed},
    {GPURUN_KEY(train, loss), non_empty(), "registry name of the loss: cross_entropy or a plugin's", kHashed},
    // Hashed, but a checkpoint of `auto` resumes under any precision (trainer's check_resumable).
    {GPURUN_KEY(train, precision), one_of({"fp32", "bf16", "fp16", "auto"}), "autocast dtype; fp16 with a gradient scaler; auto: bf16, fp16 or fp32 as the device allows", kHashed},
    // Bits, not what is learned: a resume may switch it (the manifest records it).
    {GPURUN_KEY(train, deterministic), any(), "CUDA: deterministic cuBLAS and cuDNN for an exact resume", kNotHashed},
    // Neither early_stop nor keep_best changes what one epoch learns, so a resume may change them.
    {GPURUN_KEY3(train, early_stop, metric), metric(), "stop when this epoch metric stops improving: eval_loss | eval_accuracy | train_loss; left out: off", kNotHashed},
    {GPURUN_KEY3(train, early_stop, mode), one_of({"auto", "min", "max"}), "early_stop: min | max | auto (max for eval_accuracy, min for the losses)", kNotHashed},
    {GPURUN_KEY3(train, early_stop, patience), at_least(1), "early_stop: epochs without improvement before the stop", kNotHashed},
    {GPURUN_KEY3(train, early_stop, min_delta), at_least(0), "early_stop: an improvement must beat the best by more than this", kNotHashed},
    {GPURUN_KEY(checkpoint, every_steps), at_least(0), "also save every N steps", kNotHashed},
    {GPURUN_KEY(checkpoint, every_minutes), at_least_or_auto(0), "also save every N minutes; auto: the Young/Daly interval", kNotHashed},
    {GPURUN_KEY(checkpoint, mtbf_hours), above(0), "every_minutes auto: mean hours between reclaims", kNotHashed},
    {GPURUN_KEY(checkpoint, keep_last), at_least(1), "complete checkpoints kept", kNotHashed},
    {GPURUN_KEY(checkpoint, grace_seconds), above(0), "time to save after a signal", kNotHashed},
    {GPURUN_KEY(checkpoint, lease_timeout), above(0), "seconds to a stale lease", kNotHashed},
    {GPURUN_KEY(checkpoint, async), any(), "write in the background while training goes on", kNotHashed},
    {GPURUN_KEY(checkpoint, max_failures), at_least(1), "failed saves in a row before exit 1", kNotHashed},
    {GPURUN_KEY(checkpoint, local_dir), any(), "local disk saved to first, copied to --ckpt in the background; relative to the working directory; empty: off", kNotHashed},
    {GPURUN_KEY(checkpoint, local_keep_last), at_least(1), "complete checkpoints kept in local_dir", kNotHashed},
    {GPURUN_KEY3(checkpoint, keep_best, metric), metric(), "never delete the k epoch checkpoints best by this metric: eval_loss | eval_accuracy | train_loss; left out: off", kNotHashed},
    {GPURUN_KEY3(checkpoint, keep_best, mode), one_of({"auto", "min", "max"}), "keep_best: min | max | auto (max for eval_accuracy, min for the losses)", kNotHashed},
    {GPURUN_KEY3(checkpoint, keep_best, k), at_least(1), "keep_best: best checkpoints kept beside keep_last's", kNotHashed},
    {GPURUN_KEY(memory, capacity), size_or({"auto"}), "device memory: auto or a SIZE", kNotHashed},
    {GPURUN_KEY(memory, headroom), fraction(), "fraction of the capacity left free", kNotHashed},
    {GPURUN_KEY(memory, strategy), one_of({"auto", "accumulate", "checkpoint", "none"}),
     "how to fit: auto | accumulate | checkpoint | none", kNotHashed},
    {GPURUN_KEY(memory, probe_steps), at_least(1), "measured steps per probed plan", kNotHashed},
    {GPURUN_KEY(log, every_steps), at_least(1), "a step event every N optimizer steps", kNotHashed},
    {GPURUN_KEY(distributed, timeout), above(0), "seconds a rendezvous or collective may wait", kNotHashed},
    // A resume may reshard: the state is the same, held in other places.
    {GPURUN_KEY(distributed, shard), one_of({"none", "optimizer", "gradients", "auto"}), "optimizer state sharded over the ranks: none | optimizer | gradients | auto", kNotHashed},
    // Sampling runs on a saved-and-restored RNG: it never changes what is learned.
    {GPURUN_KEY(sample, length), at_least(0), "characters generated after each epoch (token data); 0: off", kNotHashed},
    {GPURUN_KEY(sample, prompt), any(), "start text; empty: the evaluation text's first characters", kNotHashed},
    {GPURUN_KEY(sample, temperature), at_least(0), "0: greedy; > 0: sample softmax(logits / T)", kNotHashed},
    {GPURUN_KEY(sample, seed), any(), "seed of the sampling generator", kNotHashed},
    // Where the run learns early that its machine goes away, not what it learns.
    {GPURUN_KEY(preemption, watch), one_of({"auto", "aws", "gcp", "azure", "none"}), "the cloud metadata service polled for preemption notices: auto (by the machine's DMI) | aws | gcp | azure | none", kNotHashed},
    // At least 0.1 s: a metadata service throttles a client that asks faster (AWS's IMDS).
    {GPURUN_KEY(preemption, poll_seconds), at_least(0.1), "seconds between polls of the metadata service", kNotHashed},
    // Who is told about the run, and what it costs: nothing of what is learned.
    {GPURUN_KEY(notify, url), any(), "webhook the run's messages are POSTed to (JSON with a text field), or $NAME: the URL in that environment variable; never logged", kNotHashed},
    {GPURUN_KEY(notify, on), one_of(notify_events()), "events sent: started, checkpoint_failed, preempted, stalled, failed, finished, budget", kNotHashed},
    {GPURUN_KEY(notify, command), any(), "shell command run with each message's JSON on stdin", kNotHashed},
    {GPURUN_KEY(cost, price_per_hour), at_least(0), "price of one rank's device per hour; 0: the cards file's for the device, else unknown", kNotHashed},
    {GPURUN_KEY(cost, budget), at_least(0), "save and exit 4 before the spend passes it; 0: none", kNotHashed},
    {GPURUN_KEY(cost, stop_command), any(), "shell command run after a finished or budget-stopped run, once its checkpoint is safe", kNotHashed},
  };
  return kSchema;
}
// clang-format on
#undef GPURUN_KEY
#undef GPURUN_KEY3

}  // namespace gpurun::detail

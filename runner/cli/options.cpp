#include "cli/options.h"
#include "util/text.h"

namespace gpurun {
namespace {

constexpr const char* kRun = "Run";
constexpr const char* kDistributed = "Distributed (DDP; under Slurm these come from SLURM_*)";
constexpr const char* kQueue = "Queue";
constexpr const char* kExport = "Export";
constexpr const char* kPlan = "Plan";
constexpr const char* kReport = "Report";
constexpr const char* kOutput = "Output";

using T = OptionSpec::Type;

}  // namespace

const std::vector<OptionSpec>& option_table() {
  // clang-format off
  static const std::vector<OptionSpec> table = {
    {kRun, "ckpt", T::kString, "DIR", "", "checkpoint directory (local or network storage; created when missing), or s3://BUCKET/PREFIX"},
    {kRun, "resume", T::kFlag, "", "", "continue from the newest complete checkpoint in --ckpt; starts fresh when there is none"},
    {kRun, "run-dir", T::kString, "DIR", "", "where metrics.jsonl and status.json go (default: the --ckpt directory; for s3:// ~/.cache/gpurun/runs/NAME-HASH)"},
    {kRun, "set", T::kStrings, "KEY=VALUE", "", "override a config key by its dotted path, e.g. --set train.epochs=3 (repeatable; the last wins)"},
    {kRun, "force", T::kFlag, "", "", "take the checkpoint directory's lease at once, even from a run that looks alive"},
    {kRun, "no-lease", T::kFlag, "", "", "write checkpoints without holding the directory's lease: only where the storage cannot hold one (an S3 server that ignores conditional writes) and no other run can write there"},
    {kRun, "allow-data-change", T::kFlag, "", "", "resume although the data's files or sample counts changed since the checkpoint (a warning and a data_change event instead of exit 3)"},
    {kRun, "device", T::kString, "D", "auto", "auto, cpu or cuda"},
    {kRun, "max-restarts", T::kInt, "N", "0", "run training in a child process and restart it with --resume after a crash, at most N times (queue: per run)", true},
    {kRun, "hang-timeout", T::kDouble, "SECONDS", "0", "kill and restart a run that completes no step for SECONDS (needs --max-restarts; queue: per run, a hang is a failure)", true},
    {kRun, "slurm-signal", T::kString, "[B:]SIG[@TIME]", "", "the signal the Slurm job's --signal sends before its time limit, when gpurun cannot read it from the batch script's #SBATCH lines (a --signal on sbatch's command line) or it is not one gpurun stops on already (TERM, INT, USR1, USR2, HUP); TIME, the seconds it comes early, is checked against a step and a save"},
    {kRun, "memory-limit", T::kString, "SIZE", "", "treat the device as having SIZE bytes (e.g. 512MiB, 24GiB); on CPU enforced by the allocator"},
    {kDistributed, "nproc-per-node", T::kInt, "N", "", "start N worker processes on this node (Gloo on CPU, NCCL on CUDA)", true},
    {kDistributed, "nnodes", T::kInt, "N", "", "nodes in the job", true},
    {kDistributed, "node-rank", T::kInt, "R", "", "this node's index, 0..nnodes-1", true},
    {kDistributed, "master-addr", T::kString, "HOST", "", "host of rank 0 (the rendezvous store)", true},
    {kDistributed, "master-port", T::kInt, "PORT", "", "TCP port of the rendezvous store", true},
    {kPlan, "cards", T::kString, "FILE", "", "plan: the cards to forecast on (examples/cards.yaml's form); default: the bundled table"},
    {kPlan, "deadline", T::kDouble, "HOURS", "72", "plan: when one card needs longer, say how many cards DDP needs"},
    {kPlan, "probe-precisions", T::kFlag, "", "", "plan: also measure the plan's step under the precisions the run does not use (real steps; otherwise they are estimated)"},
    {kPlan, "world-size", T::kInt, "N", "1", "plan: the ranks of the run (--nproc-per-node x --nnodes): the plan and its breakdown are per rank, with distributed.shard"},
    {kPlan, "estimate-only", T::kFlag, "", "", "plan: build the model without its weights and run nothing: the estimate alone (automatic when the weights do not fit here)"},
    {kQueue, "dir", T::kString, "DIR", "", "queue: the queue's directory (its state, and each run's checkpoints in DIR/runs/NAME); the same command continues it"},
    {kQueue, "parallel", T::kInt, "N", "1", "queue: train N runs at once (one CUDA device each; on CPU the threads are split)"},
    {kExport, "to", T::kString, "PATH", "", "export: FILE (an existing file is replaced, a directory refused) for the newest complete checkpoint's model; with --format hf or peft a new or empty DIR"},
    {kExport, "format", T::kString, "F", "pt", "export: pt (a torch.save state_dict), hf (a Hugging Face model folder: config.json and safetensors, for a model.name hf run) or peft (a LoRA run's adapter for PEFT)"},
    {kExport, "max-shard-size", T::kString, "SIZE", "5GB", "export --format hf: the largest safetensors file; a larger model is cut into shards listed by model.safetensors.index.json, as save_pretrained does"},
    {kExport, "dtype", T::kString, "D", "", "export --format hf|peft: float32, bfloat16 or float16 (default: hf the input folder's, peft float32)"},
    {kExport, "step", T::kInt, "N", "", "export: the checkpoint of global step N rather than the newest (which must verify, else export refuses)"},
    {kExport, "best", T::kFlag, "", "", "export: the best checkpoint by checkpoint.keep_best's metric that verifies (one that does not is skipped for the next best)"},
    {kExport, "merge-lora", T::kFlag, "", "", "export: add each LoRA adapter (B A alpha/rank) into its base weight and drop the adapters: plain weights of the base architecture"},
    {kReport, "out", T::kString, "FILE.html", "", "report: where to write the page (default: DIR/report.html)"},
    {kOutput, "json", T::kFlag, "", "", "print exactly one JSON object on stdout (plan, ckpt, status)"},
    {kOutput, "h,help", T::kFlag, "", "", "show this help"},
    {kOutput, "version", T::kFlag, "", "", "print the version"},
  };
  // clang-format on
  return table;
}

const std::vector<std::string>& option_groups() {
  static const std::vector<std::string> groups = {kRun,    kDistributed, kPlan,  kQueue,
                                                  kExport, kReport,      kOutput};
  return groups;
}

std::vector<std::string> without_launcher_options(const std::vector<std::string>& argv) {
  if (argv.empty()) return {};
  std::vector<std::string> out{argv[0]};
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    bool dropped = false;
    for (const OptionSpec& o : option_table()) {
      if (!o.launcher_only) continue;
      const std::string flag = std::string("--") + o.name;
      const bool takes_value = o.type != OptionSpec::Type::kFlag;
      if (a == flag) {
        i += takes_value ? 1 : 0;
        dropped = true;
        break;
      }
      if (takes_value && starts_with(a, flag + "=")) {
        dropped = true;
        break;
      }
    }
    if (!dropped) out.push_back(a);
  }
  return out;
}

}  // namespace gpurun

#!/usr/bin/env bash
# A training step of a small Hugging Face Llama on the CPU, gpurun (`model: {name: hf}`) against
# transformers + PyTorch eager, side by side in one run, 2 rounds interleaved, fp32 and then bf16:
#   the model: make_tiny.py's Llama of 4 layers, hidden 256, 4 heads, 2 KV heads, intermediate
#   688, vocab 4096, saved by save_pretrained in fp32; context 256, global batch 8 (one
#   micro-batch), AdamW lr 1e-4, weight decay 0.01, random token ids (make_tiny.py tokens),
#   windows taken in sequence; both sides on nproc threads (train.threads, torch.set_num_threads).
#   gpurun: data.workers 0, memory.probe_steps 1, a step event every step, a checkpoint at the
#   end only; tokens/s = samples_per_second x context of its step events (the wall time between
#   two events), the median after the first three and without the last (the epoch's evaluation
#   and checkpoint fall into it). bf16 is train.precision bf16: fp32 weights, autocast.
#   PyTorch: AutoModelForCausalLM.from_pretrained of the same folder (attn_implementation sdpa,
#   fp32 weights), torch.optim.AdamW with its CPU defaults (no foreach, no fused), forward with
#   use_cache=False (no KV cache is built in training), cross_entropy over all positions as
#   gpurun's loss; bf16 runs the forward and the loss under torch.autocast("cpu", bfloat16), the
#   backward and the step outside it, as gpurun does. Step time: the wall time between the ends
#   of two optimizer steps, the batch's slicing from the token file included, the same median.
# Both sides run the same number of steps (STEPS, default 60: 20 s (fp32) to 35 s (bf16) a run on
# 2 cores; the whole script about 4 minutes).
# Usage: scripts/bench/hf_step.sh   (GPURUN=path/to/gpurun, default build/runner/gpurun;
#        STEPS=N optimizer steps a run; VOCAB=32000 for a Llama-2-sized vocabulary, 3x slower a
#        step: STEPS=24 keeps the runs as long)
set -euo pipefail
cd "$(dirname "$0")/../.."
gpurun=${GPURUN:-build/runner/gpurun}
steps=${STEPS:-60}
vocab=${VOCAB:-4096}
threads=$(nproc)
context=256
batch=8
python=$(scripts/install-deps.sh --print-hf-python)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
token_dtype=uint16
[ "$vocab" -le 65536 ] || token_dtype=uint32
"$python" tests/tools/hf/make_tiny.py model "$work/llama" --layers 4 --hidden 256 --heads 4 \
  --kv-heads 2 --intermediate 688 --vocab "$vocab" --max-positions $context >/dev/null
"$python" tests/tools/hf/make_tiny.py tokens --tokens "$work/train.bin" --eval-tokens "$work/val.bin" \
  --n-tokens $((steps * batch * context + 1)) --n-eval-tokens $((batch * context + 1)) \
  --vocab "$vocab" --token-dtype $token_dtype >/dev/null
cat >"$work/run.yaml" <<YAML
model: {name: hf, path: $work/llama}
data: {name: tokens, path: $work/train.bin, eval_path: $work/val.bin, dtype: $token_dtype,
       vocab_size: $vocab, context: $context, windows: sequential, workers: 0,
       train_samples: $((steps * batch)), eval_samples: $batch}
optim: {name: adamw, lr: 0.0001, weight_decay: 0.01}
train: {epochs: 1, batch_size: $batch, eval_batch_size: $batch, threads: $threads}
memory: {probe_steps: 1}
log: {every_steps: 1}
YAML
cat >"$work/eager.py" <<'PY'
# eager.py MODEL_DIR TOKENS DTYPE PRECISION STEPS BATCH CONTEXT THREADS: the median tokens/s
import statistics, sys, time
import numpy as np, torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
path, tokens, dtype, precision = sys.argv[1:5]
steps, batch, context, threads = map(int, sys.argv[5:9])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
ids = np.memmap(tokens, dtype=np.dtype("<u2" if dtype == "uint16" else "<u4"), mode="r")
bf16 = precision == "bf16"
ends = [time.perf_counter()]
for step in range(steps):
    rows = [torch.from_numpy(ids[i * context:(i + 1) * context + 1].astype(np.int64))
            for i in range(step * batch, (step + 1) * batch)]
    window = torch.stack(rows)
    x, y = window[:, :-1], window[:, 1:]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    ends.append(time.perf_counter())
seconds = [b - a for a, b in zip(ends, ends[1:])][3:]
print(batch * context / statistics.median(seconds))
PY
gpurun_tokens() {  # RUN_DIR: the median tokens/s of its step events after the first three
  /usr/bin/python3 - "$1" $context $batch <<'PY'
import json, statistics, sys
run, context, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
events = [json.loads(l) for l in open(run + "/metrics.jsonl")]
plan = next(e for e in events if e["event"] == "plan")
if plan["micro_batch"] != batch or plan["activation_checkpointing"]:
    print(f"gpurun planned micro-batch {plan['micro_batch']}, activation checkpointing "
          f"{plan['activation_checkpointing']}: not the step compared", file=sys.stderr)
steps = [e for e in events if e["event"] == "step"][3:-1]
print(statistics.median(e["samples_per_second"] * context for e in steps))
PY
}
: >"$work/results"
for round in 1 2; do
  for precision in fp32 bf16; do
    run="$work/gpurun-$precision-$round"
    "$gpurun" "$work/run.yaml" --ckpt "$run" --set train.precision=$precision \
      >"$work/gpurun.log" 2>&1 || { tail -20 "$work/gpurun.log" >&2; exit 1; }
    echo "$precision gpurun $(gpurun_tokens "$run")" >>"$work/results"
    rm -rf "$run"
    tokens=$("$python" "$work/eager.py" "$work/llama" "$work/train.bin" $token_dtype $precision \
      "$steps" $batch $context "$threads" 2>"$work/eager.err") ||
      { tail -20 "$work/eager.err" >&2; exit 1; }
    echo "$precision pytorch $tokens" >>"$work/results"
  done
done
/usr/bin/python3 - "$work/results" "$vocab" "$threads" "$steps" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    precision, side, tokens = line.split()
    rows.setdefault((precision, side), []).append(float(tokens))
print(f"Llama 4 x 256 (4 heads, 2 KV heads, intermediate 688, vocab {sys.argv[2]}), context 256, "
      f"batch 8, AdamW, CPU, {sys.argv[3]} threads, {sys.argv[4]} steps a run, 2 rounds")
print(f"{'variant':<8}{'gpurun tok/s':>22}{'PyTorch tok/s':>22}{'ratio':>8}  (gpurun / PyTorch; goal >= 1.0)")
for precision in ("fp32", "bf16"):
    g, p = rows[(precision, "gpurun")], rows[(precision, "pytorch")]
    cell = lambda v: f"{statistics.median(v):.0f} ({', '.join(f'{x:.0f}' for x in v)})"
    print(f"{precision:<8}{cell(g):>22}{cell(p):>22}{statistics.median(g) / statistics.median(p):>8.2f}")
PY

#!/usr/bin/env bash
# Peak memory and step time of the gpt with a long context under fp32, bf16, bf16 with
# activation checkpointing, and LoRA (rank 8 on the attention and MLP Linears, fp32), measured
# side by side in one run by `gpurun plan --json`: its probes run real training steps of the
# configured micro-batch (memory.probe_steps of them; the first is not timed) and measure the
# peak allocated bytes. Activation checkpointing is forced by a --memory-limit a little below
# bf16's plain peak, with memory.strategy: checkpoint.
# Usage: scripts/bench/precision.sh [KEY=VALUE...]   Needs a build (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
kjv=/usr/local/share/gpurun/kjv.txt
[ -s "$kjv" ] || { echo "no $kjv: run scripts/install-deps.sh" >&2; exit 1; }
cat >"$work/gpt.yaml" <<YAML
model: {name: gpt, layers: 4, heads: 8, width: 256, dropout: 0.1}
data: {name: text, path: $kjv, context: 512, train_samples: 256, eval_samples: 32}
optim: {name: adamw, lr: 0.001}
train: {batch_size: 8, eval_batch_size: 8, threads: $(nproc)}
memory: {probe_steps: 4}
YAML
extra=()
for s in "$@"; do extra+=(--set "$s"); done
plan() {  # NAME ARGS...: one line of JSON per variant
  local name=$1
  shift
  build/runner/gpurun plan "$work/gpt.yaml" --json "${extra[@]}" "$@" 2>"$work/$name.err" |
    /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(json.dumps({"name": sys.argv[1], "peak": j["measured_peaks"]["training"], "seconds": j["step_seconds"], "checkpointing": j["activation_checkpointing"], "micro_batch": j["micro_batch"], "precision": j["precision"]}))' "$name" \
    >>"$work/results.jsonl" || { cat "$work/$name.err" >&2; exit 1; }
}
plan fp32 --set train.precision=fp32
plan bf16 --set train.precision=bf16
bf16_peak=$(/usr/bin/python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][-1]["peak"])' "$work/results.jsonl")
# Headroom 0: the limit is the usable capacity; 90% of the plain peak leaves only checkpointing.
limit=$((bf16_peak * 9 / 10))
plan bf16+checkpointing --set train.precision=bf16 --set memory.strategy=checkpoint \
  --set memory.headroom=0 --memory-limit "$limit"
plan "lora r8 (fp32)" --set train.precision=fp32 --set model.lora.rank=8 \
  --set 'model.lora.targets=["*.attention.*","*.expand","*.contract"]'
/usr/bin/python3 - "$work/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = rows[0]
print("gpt 4 x 256, context 512, micro-batch 8, CPU; one run, side by side")
print(f"{'variant':<22}{'peak':>12}{'vs fp32':>9}{'step s':>10}{'vs fp32':>9}  plan")
for r in rows:
    plan = f"{r['precision']}, micro-batch {r['micro_batch']}" + (", activation checkpointing" if r["checkpointing"] else "")
    print(f"{r['name']:<22}{r['peak'] / 2**20:>9.1f} MiB{r['peak'] / base['peak']:>8.2f}x"
          f"{r['seconds']:>10.3f}{r['seconds'] / base['seconds']:>8.2f}x  {plan}")
PY

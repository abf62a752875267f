#!/usr/bin/env bash
# DDP bench, in one run on this machine: all-reduce calls and bytes per optimizer step (from
# the `step` events of metrics.jsonl), and the optimizer-step time of 2 ranks (Gloo, 1 thread
# each) vs 1 process (1 thread) on the same global batch, alternating 3 rounds.
# Usage: scripts/bench/ddp.sh   (GPURUN=path/to/gpurun, default build/runner/gpurun)
set -euo pipefail
cd "$(dirname "$0")/../.."
gpurun=${GPURUN:-build/runner/gpurun}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/run.yaml" <<'YAML'
model: {name: mlp, hidden: [1024, 1024]}
data: {name: idx, train_samples: 6400, eval_samples: 200}
optim: {name: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 1, batch_size: 128, threads: 1}
log: {every_steps: 10}
YAML
for round in 1 2 3; do
  for n in 1 2; do
    "$gpurun" "$work/run.yaml" --ckpt "$work/r$round-n$n" --nproc-per-node $n 2>/dev/null
  done
done
/usr/bin/python3 - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]
def steps(d):
    return [json.loads(l) for l in open(f"{work}/{d}/metrics.jsonl") if '"event":"step"' in l]
rate = {1: [], 2: []}
for r in (1, 2, 3):
    for n in (1, 2):
        s = steps(f"r{r}-n{n}")[1:]  # the first interval holds warm-up
        rate[n].append(statistics.median(e["samples_per_second"] for e in s))
two = steps("r1-n2")[1:]
print("model: MLP 784-1024-1024-10 (1.86 M parameters, 7.4 MB of float32 gradients), global batch 128")
print(f"gradient syncs per optimizer step : {statistics.mean(e['gradient_syncs_per_step'] for e in two):.2f}")
print(f"all-reduce calls per step         : {statistics.mean(e['all_reduce_calls_per_step'] for e in two):.2f}")
print(f"all-reduce bytes per step         : {statistics.mean(e['all_reduce_bytes_per_step'] for e in two) / 2**20:.2f} MiB")
for n in (1, 2):
    print(f"{n} rank(s): samples/s by round     : " + ", ".join(f"{v:.0f}" for v in rate[n]))
m1, m2 = statistics.median(rate[1]), statistics.median(rate[2])
print(f"step time 2 ranks / 1 process     : {m1 / m2:.3f}  (below 1: 2 ranks are faster)")
print(f"speed-up of 2 ranks               : {m2 / m1:.2f}x on {__import__('os').cpu_count()} cores")
PY

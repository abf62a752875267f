#!/usr/bin/env bash
# The data wait of the Fashion-MNIST example: the seconds the training thread blocks waiting for
# its batches (the step events' data_wait_seconds, data/loader.h) divided by the step time, with
# data.workers 0 (each batch fetched on the training thread) and with workers, side by side.
# Usage: scripts/bench/data_wait.sh [CONFIG] [KEY=VALUE...]   (after scripts/build.sh)
# Goal: ratio <= 0.01 with workers >= 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
config=${1:-examples/fashion_mnist.yaml}
shift || true
sets=(data.train_samples=6400 data.eval_samples=500 train.epochs=1 log.every_steps=10
      checkpoint.every_minutes=0 "$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=()
for s in "${sets[@]}"; do args+=(--set "$s"); done

for workers in 0 1 2; do
  build/runner/gpurun "$config" --ckpt "$work/w$workers" "${args[@]}" \
    --set data.workers=$workers 2>/dev/null
done

/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
print(f"{'data.workers':>12}  {'wait/step ms':>12}  {'step ms':>8}  {'wait / step time':>16}")
for workers in (0, 1, 2):
    events = [json.loads(l) for l in open(f"{work}/w{workers}/metrics.jsonl")]
    steps = [e for e in events if e["event"] == "step"]
    # Between the first and the last step event: the epoch's evaluation and save come after the
    # last one, and the first interval holds the loader's start.
    first, last = steps[0], steps[-1]
    n = last["global_step"] - first["global_step"]
    step_seconds = (last["time"] - first["time"]) / n
    wait = sum(b["data_wait_seconds"] * (b["global_step"] - a["global_step"])
               for a, b in zip(steps, steps[1:])) / n
    print(f"{workers:>12}  {wait * 1e3:>12.3f}  {step_seconds * 1e3:>8.2f}  {wait / step_seconds:>16.4f}"
          + ("   (goal <= 0.01)" if workers else ""))
PY

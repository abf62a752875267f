#!/usr/bin/env bash
# gpurun vs a minimal hand-written LibTorch loop: samples/s on the same model, data and thread
# count, measured side by side (alternating, 3 rounds each, medians), and gpurun's checkpoint
# size and write time. Usage: scripts/bench/throughput.sh [CONFIG] [KEY=VALUE...]
# Needs a build (scripts/build.sh). Goal: ratio >= 0.97.
set -euo pipefail
cd "$(dirname "$0")/../.."
config=${1:-examples/fashion_mnist.yaml}
shift || true
sets=(data.train_samples=12800 data.eval_samples=500 train.epochs=1 log.every_steps=10
      checkpoint.every_steps=50 "train.threads=$(nproc)" "$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gpurun_args=()
for s in "${sets[@]}"; do gpurun_args+=(--set "$s"); done

for round in 1 2 3; do
  build/scripts/bench/gpurun_bench_plain_loop "$config" "${sets[@]}" >>"$work/plain.jsonl" 2>/dev/null
  build/runner/gpurun "$config" --ckpt "$work/ckpt$round" "${gpurun_args[@]}" 2>/dev/null
  cp "$work/ckpt$round/metrics.jsonl" "$work/gpurun$round.jsonl"
done

batch=$(build/runner/gpurun ckpt inspect "$work/ckpt1" --json 2>/dev/null |
        /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["plan"]["global_batch"])')
/usr/bin/python3 - "$work" "$batch" <<'PY'
import json, statistics, sys, glob
work, batch = sys.argv[1], int(sys.argv[2])
plain = [json.loads(l)["samples_per_second"] for l in open(f"{work}/plain.jsonl")]
ours, sizes, writes, stalls = [], [], [], []
for path in sorted(glob.glob(f"{work}/gpurun*.jsonl")):
    events = [json.loads(l) for l in open(path)]
    steps = [e for e in events if e["event"] == "step"]
    for e in events:
        if e["event"] == "checkpoint":
            sizes.append(e["bytes"]); writes.append(e["write_seconds"]); stalls.append(e["stall_seconds"])
    # samples/s between the first and last step events, checkpoint stalls excluded as in the
    # plain loop (which does not save): subtract the stall time of the saves in between.
    first, last = steps[0], steps[-1]
    stalled = sum(e["stall_seconds"] for e in events if e["event"] == "checkpoint"
                  and first["global_step"] < e["global_step"] <= last["global_step"])
    ours.append((last["global_step"] - first["global_step"]) * batch / (last["time"] - first["time"] - stalled))
p, o = statistics.median(plain), statistics.median(ours)
print(f"plain LibTorch loop : {p:8.1f} samples/s  (rounds: {', '.join(f'{x:.0f}' for x in plain)})")
print(f"gpurun              : {o:8.1f} samples/s  (rounds: {', '.join(f'{x:.0f}' for x in ours)})")
print(f"ratio gpurun/plain  : {o / p:.3f}   (goal >= 0.97)")
print(f"checkpoint size     : {statistics.median(sizes) / 2**20:.2f} MiB, write {statistics.median(writes) * 1000:.1f} ms "
      f"(median of {len(writes)}), training stall {statistics.median(stalls) * 1000:.1f} ms")
PY

#!/usr/bin/env bash
# Checkpoint bench, in one run: per checkpoint the training stall with asynchronous save vs
# the full synchronous save time, and gpurun's write throughput vs `cp` of the same bytes into
# the same directory (followed by sync, as gpurun fsyncs). Usage: scripts/bench/checkpoint.sh [DIR]
# DIR: where checkpoints go (default: a temporary directory; point it at the NAS to measure it).
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${1:-$(mktemp -d)}
mkdir -p "$target"
work=$(mktemp -d "$target/gpurun-bench-XXXXXX")
trap 'rm -rf "$work"' EXIT
cat >"$work/run.yaml" <<'YAML'
model: {name: mlp, hidden: [2048, 2048]}
data: {name: idx, train_samples: 6400, eval_samples: 200}
optim: {name: adam, lr: 0.0005}
train: {epochs: 1, batch_size: 64, threads: 2}
checkpoint: {every_steps: 10, keep_last: 2}
log: {every_steps: 10}
YAML
for mode in true false; do
  build/runner/gpurun "$work/run.yaml" --ckpt "$work/async-$mode" --set checkpoint.async=$mode 2>/dev/null
done
one=$(ls -d "$work"/async-true/ckpt-* | tail -1)
start=$(date +%s.%N); cp -r "$one" "$work/cp-copy"; sync; end=$(date +%s.%N)
/usr/bin/python3 - "$work" "$start" "$end" "$one" <<'PY'
import json, os, statistics, sys
work, start, end, one = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
def saves(mode):
    return [json.loads(l) for l in open(f"{work}/async-{mode}/metrics.jsonl") if '"checkpoint"' in l]
a, s = saves("true"), saves("false")
stall_async = statistics.median(e["stall_seconds"] for e in a)
stall_sync = statistics.median(e["stall_seconds"] for e in s)  # inline write included
size = statistics.median(e["bytes"] for e in a)
write = statistics.median(e["write_seconds"] for e in a)
cp_bytes = sum(os.path.getsize(os.path.join(one, f)) for f in os.listdir(one))
print(f"checkpoint size            : {size / 2**20:.1f} MiB ({len(a)} async saves, {len(s)} synchronous)")
print(f"training stall, async      : {stall_async * 1000:8.1f} ms (median)")
print(f"training stall, synchronous: {stall_sync * 1000:8.1f} ms (median)")
print(f"stall ratio async/sync     : {stall_async / stall_sync:.3f}")
print(f"gpurun write throughput    : {size / write / 2**20:8.1f} MiB/s (fsync of every file and folder)")
print(f"cp + sync throughput       : {cp_bytes / (end - start) / 2**20:8.1f} MiB/s")
print(f"ratio gpurun/cp            : {(size / write) / (cp_bytes / (end - start)):.2f}")
PY

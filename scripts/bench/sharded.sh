#!/usr/bin/env bash
# The sharded optimizer, side by side in one run on this machine, 2 ranks over Gloo, 1 thread
# each, alternating 3 rounds:
#  1. on a gpt (4 blocks x 256, the King James Bible): gpurun's 2-rank sharded step
#     (distributed.shard: optimizer) against its 2-rank DDP step, and the bytes each moves per
#     optimizer step (the step events' moved_bytes_per_step, ring model);
#  2. on an MLP 784-2048-2048-10 with AdamW, global batch 128: gpurun sharded against PyTorch's
#     ZeroRedundancyOptimizer + DistributedDataParallel under torchrun (Gloo), the PyTorch of
#     install-deps.sh. PyTorch's loop trains on random tensors already in memory; gpurun's reads
#     Fashion-MNIST through its data set, which only counts against gpurun.
# Step times are medians of the step events after the first (warm-up) interval.
# Usage: scripts/bench/sharded.sh   (GPURUN=path/to/gpurun, default build/runner/gpurun)
set -euo pipefail
cd "$(dirname "$0")/../.."
gpurun=${GPURUN:-build/runner/gpurun}
python=$(scripts/install-deps.sh --print-torch-python)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/gpt.yaml" <<'YAML'
model: {name: gpt, layers: 4, width: 256, heads: 4}
data: {name: text, path: /usr/local/share/gpurun/kjv.txt, context: 64, train_samples: 1280, eval_samples: 64}
optim: {name: adamw, lr: 0.0003, weight_decay: 0.1}
train: {epochs: 1, batch_size: 32, threads: 1}
memory: {probe_steps: 1}
log: {every_steps: 5}
YAML
cat >"$work/mlp.yaml" <<'YAML'
model: {name: mlp, hidden: [2048, 2048]}
data: {name: idx, train_samples: 3840, eval_samples: 128}
optim: {name: adamw, lr: 0.0005, weight_decay: 0.01}
train: {epochs: 1, batch_size: 128, threads: 1}
memory: {probe_steps: 1}
log: {every_steps: 5}
YAML
cat >"$work/zero.py" <<'PY'
import os, statistics, sys, time
import torch, torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)))
opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=5e-4,
                              weight_decay=0.01)
local = 128 // world
x, y = torch.randn(local, 1, 28, 28), torch.randint(10, (local,))
times = []
for step in range(30):
    t = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    times.append(time.perf_counter() - t)
if rank == 0:
    print(statistics.median(times[5:]))
dist.destroy_process_group()
PY
steps() {  # median seconds per optimizer step and moved bytes, from a run's step events
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, statistics, sys
events = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"event":"step"' in l][1:]
batch = int(sys.argv[2])
print(statistics.median(batch / e["samples_per_second"] for e in events),
      statistics.median(e.get("moved_bytes_per_step", 0) for e in events))
PY
}
: >"$work/results"
for round in 1 2 3; do
  for shard in none optimizer; do
    "$gpurun" "$work/gpt.yaml" --ckpt "$work/gpt-$shard-$round" --nproc-per-node 2 \
      --set distributed.shard=$shard 2>/dev/null
    echo "gpt $shard $(steps "$work/gpt-$shard-$round" 32)" >>"$work/results"
  done
  "$gpurun" "$work/mlp.yaml" --ckpt "$work/mlp-$round" --nproc-per-node 2 \
    --set distributed.shard=optimizer 2>/dev/null
  echo "mlp optimizer $(steps "$work/mlp-$round" 128)" >>"$work/results"
  echo "mlp zero $("$python" -m torch.distributed.run --nproc-per-node 2 "$work/zero.py" 2>/dev/null | tail -1) 0" >>"$work/results"
done
/usr/bin/python3 - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    model, mode, seconds, moved = line.split()
    rows.setdefault((model, mode), []).append((float(seconds), float(moved)))
med = lambda k, i=0: statistics.median(r[i] for r in rows[k])
for k, v in sorted(rows.items()):
    print(f"{k[0]:4} {k[1]:10}: step {', '.join(f'{s * 1e3:.0f}' for s, _ in v)} ms; moved {v[0][1] / 2**20:.2f} MiB")
print(f"gpt: sharded step / DDP step            : {med(('gpt', 'optimizer')) / med(('gpt', 'none')):.2f}  (goal <= 1.05)")
print(f"gpt: bytes moved, sharded / DDP         : {med(('gpt', 'optimizer'), 1) / med(('gpt', 'none'), 1):.2f}  (goal 1.0)")
print(f"mlp: sharded step / ZeroRedundancyOptimizer + DDP (torchrun): {med(('mlp', 'optimizer')) / med(('mlp', 'zero')):.2f}  (goal <= 1.0)")
PY

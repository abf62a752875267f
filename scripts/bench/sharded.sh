#!/usr/bin/env bash
# The sharded optimizer, side by side in one run on this machine, over Gloo, 1 thread a rank,
# alternating 3 rounds:
#  1. a gpt of 6 blocks x 384, 6 heads, context 256, global batch 16 (the King James Bible for
#     gpurun, random ids in memory for PyTorch): gpurun's replicated (DDP) and sharded
#     (distributed.shard: optimizer) steps against PyTorch's DDP, ZeroRedundancyOptimizer + DDP
#     and FSDP2 under torchrun (scripts/bench/sharded_gpt.py, the same model in PyTorch), at 2
#     and 4 ranks, and the bytes gpurun moves per step (the step events' moved_bytes_per_step);
#  2. an MLP 784-2048-2048-10 with AdamW, global batch 128, 2 ranks: gpurun sharded against
#     ZeroRedundancyOptimizer + DistributedDataParallel.
# PyTorch is the one install-deps.sh installed. Step times are medians of the step events after
# the first three. On a machine with fewer cores than ranks both sides share them alike.
# Usage: scripts/bench/sharded.sh   (GPURUN=path/to/gpurun, default build/runner/gpurun)
set -euo pipefail
cd "$(dirname "$0")/../.."
gpurun=${GPURUN:-build/runner/gpurun}
python=$(scripts/install-deps.sh --print-torch-python)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/gpt.yaml" <<'YAML'
model: {name: gpt, layers: 6, width: 384, heads: 6, dropout: 0}
data: {name: text, path: /usr/local/share/gpurun/kjv.txt, context: 256, train_samples: 256, eval_samples: 16}
optim: {name: adamw, lr: 0.0003, weight_decay: 0.1}
train: {epochs: 1, batch_size: 16, threads: 1}
memory: {probe_steps: 1}
log: {every_steps: 1}
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
events = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"event":"step"' in l][3:]
batch = int(sys.argv[2])
print(statistics.median(batch / e["samples_per_second"] for e in events),
      statistics.median(e.get("moved_bytes_per_step", 0) for e in events))
PY
}
: >"$work/results"
for round in 1 2 3; do
  for n in 2 4; do
    for shard in none optimizer; do
      "$gpurun" "$work/gpt.yaml" --ckpt "$work/gpt-$n-$shard-$round" --nproc-per-node $n \
        --set distributed.shard=$shard 2>/dev/null
      echo "gpt$n $shard $(steps "$work/gpt-$n-$shard-$round" 16)" >>"$work/results"
    done
    for mode in ddp zero fsdp2; do
      # torchrun's exit code can be a rank's trouble tearing Gloo down after rank 0 printed.
      seconds=$("$python" -m torch.distributed.run --nproc-per-node $n scripts/bench/sharded_gpt.py \
        $mode 6 384 6 256 16 16 2>"$work/torch.err" | tail -1) || true
      [ -n "$seconds" ] || { echo "PyTorch $mode on $n ranks failed:" >&2; tail -5 "$work/torch.err" >&2; exit 1; }
      echo "gpt$n torch-$mode $seconds 0" >>"$work/results"
    done
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
    print(f"{k[0]:5} {k[1]:12}: step {', '.join(f'{s * 1e3:.0f}' for s, _ in v)} ms"
          + (f"; moved {v[0][1] / 2**20:.2f} MiB" if v[0][1] else ""))
for n in (2, 4):
    g = f"gpt{n}"
    print(f"gpt, {n} ranks: gpurun sharded / ZeroRedundancyOptimizer + DDP: "
          f"{med((g, 'optimizer')) / med((g, 'torch-zero')):.2f}  (goal <= 1.0)")
    print(f"gpt, {n} ranks: gpurun sharded / FSDP2                         : "
          f"{med((g, 'optimizer')) / med((g, 'torch-fsdp2')):.2f}")
    print(f"gpt, {n} ranks: gpurun replicated / DDP                         : "
          f"{med((g, 'none')) / med((g, 'torch-ddp')):.2f}  (goal <= 1.0)")
    print(f"gpt, {n} ranks: gpurun sharded / gpurun replicated              : "
          f"{med((g, 'optimizer')) / med((g, 'none')):.2f}; bytes moved "
          f"{med((g, 'optimizer'), 1) / med((g, 'none'), 1):.2f}")
print(f"mlp, 2 ranks: gpurun sharded / ZeroRedundancyOptimizer + DDP: {med(('mlp', 'optimizer')) / med(('mlp', 'zero')):.2f}  (goal <= 1.0)")
PY

#!/usr/bin/env bash
# The optimizer step, side by side in one run on this machine, on the parameters of a gpt
# (6 blocks x 512, about 19 M parameters; override with --set): LibTorch's per-parameter
# AdamW, gpurun's flat optimizer (ATen's fused AdamW over the flat buffer, one rank), and
# PyTorch's torch.optim.AdamW in Python, default (foreach) and fused=True, on tensors of the
# same shapes. Medians of 10 steps after 3 warm-up steps; 2 threads everywhere.
# Usage: scripts/bench/optimizer_step.sh [--set KEY=VALUE ...]   Needs a build.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python=$(scripts/install-deps.sh --print-torch-python)
cat >"$work/run.yaml" <<'YAML'
model: {name: gpt, layers: 6, width: 512, heads: 8, context: 128}
data: {name: text, path: /usr/local/share/gpurun/kjv.txt, context: 128, train_samples: 256}
optim: {name: adamw, lr: 0.0003, weight_decay: 0.1}
train: {threads: 2}
YAML
build/scripts/bench/gpurun_bench_optimizer "$work/run.yaml" 10 "$@" >"$work/cpp.json"
"$python" - "$work/cpp.json" <<'PY'
import json, statistics, sys, time
import torch
torch.set_num_threads(2)
c = json.load(open(sys.argv[1]))
def bench(**kw):
    ps = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in c["shapes"]]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.AdamW(ps, lr=3e-4, weight_decay=0.1, **kw)
    times = []
    for i in range(13):
        t = time.perf_counter(); opt.step(); dt = time.perf_counter() - t
        if i >= 3: times.append(dt)
    return statistics.median(times)
py_default, py_fused = bench(), bench(fused=True)
lt, fl = c["libtorch_adamw_seconds"], c["flat_fused_adamw_seconds"]
print(f"parameters: {c['parameters'] / 1e6:.1f} M in {c['tensors']} tensors, {c['threads']} threads")
print(f"LibTorch AdamW (per parameter)     : {lt * 1e3:8.1f} ms")
print(f"gpurun flat fused AdamW            : {fl * 1e3:8.1f} ms")
print(f"PyTorch AdamW (default, foreach)   : {py_default * 1e3:8.1f} ms")
print(f"PyTorch AdamW (fused=True)         : {py_fused * 1e3:8.1f} ms")
print(f"flat fused / LibTorch per-parameter: {fl / lt:.2f}")
print(f"flat fused / PyTorch default       : {fl / py_default:.2f}   (goal <= 1.0)")
print(f"flat fused / PyTorch fused=True    : {fl / py_fused:.2f}   (goal <= 1.0)")
PY

#!/usr/bin/env bash
# Checkpoint bench, side by side in one run, on a state of about 420 MiB (MLP 784-4096-4096-4096
# with Adam): the training stall of an asynchronous save against a synchronous save and against
# a plain memcpy of the same bytes, the stall with a local tier in front of a slow network tier
# against the stall without; a checkpoint's write end to end (the writer thread's build and
# write seconds of the `checkpoint` events, the capture excluded) against Python's torch.save
# plus fsync of the same tensors and against `dd conv=fsync` of the same size into the same
# directory; the host memory a save holds above its capture buffers
# (gpurun_bench_checkpoint_memory); and gpurun's resume load against Python's torch.load of the
# same model.pt. Usage: scripts/bench/checkpoint.sh [DIR]
# DIR: where checkpoints go (default: a temporary directory; point it at the NAS to measure it).
# Needs a build (scripts/build.sh, or: ninja -C build gpurun gpurun_bench_checkpoint_memory).
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${1:-$(mktemp -d)}
mkdir -p "$target"
work=$(mktemp -d "$target/gpurun-bench-XXXXXX")
trap 'rm -rf "$work"' EXIT
python=$(scripts/install-deps.sh --print-torch-python)
cp scripts/bench/checkpoint_state.yaml "$work/run.yaml"
for mode in true false; do
  build/runner/gpurun "$work/run.yaml" --ckpt "$work/async-$mode" --set checkpoint.async=$mode 2>/dev/null
done
# A local tier in front of a slow network tier: 2 s of injected latency in every copy to --ckpt.
GPURUN_FAULT=sleep2000:copy_before_rename:* build/runner/gpurun "$work/run.yaml" \
  --ckpt "$work/async-tiered" --set checkpoint.local_dir="$work/local" 2>/dev/null
# Resumes of the finished run: each reads, verifies and restores its final checkpoint and
# trains nothing. The first reads from the disk: the checkpoint's pages are dropped from the page
# cache first (the runs since wrote gigabytes, which evict some of them anyway, so a warm read
# would depend on the machine's memory). The second reads from the page cache. Python's
# torch.load is measured both ways on the same model.pt.
one=$(ls -d "$work"/async-true/ckpt-* | tail -1)
evict() { "$python" -c 'import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"; }
evict "$one"/*
build/runner/gpurun "$work/run.yaml" --ckpt "$work/async-true" --resume 2>/dev/null
build/runner/gpurun "$work/run.yaml" --ckpt "$work/async-true" --resume 2>/dev/null
bytes=$(cat "$one"/*.pt | wc -c)
# Three times, each after 5 s at rest, as a checkpoint comes minutes after the last one: a write
# that follows the deletion of as many bytes within a second reuses page-cache pages the kernel
# has not yet handed back, and on a VM with free page reporting (page_reporting in the kernel's
# command line) that is several times faster than the steady state (torch.save + fsync of 448 MiB
# here: 0.35-0.40 s back to back, 0.9-1.6 s with 5 s between).
dd_lines=""
for _ in 1 2 3; do
  sleep 5
  dd_lines+=$(dd if=/dev/zero of="$work/dd.bin" bs=8M count=$(( (bytes + 8388607) / 8388608 )) conv=fsync 2>&1 | tail -1)$'\n'
  rm -f "$work/dd.bin"
done
# The host memory of a save above its capture buffers, in a process of its own (median of 3).
# The same with each file built in memory first, as saves were before they were streamed.
memory=$(build/scripts/bench/gpurun_bench_checkpoint_memory "$work/memory" 3)
rm -rf "$work/memory"
memory_images=$(build/scripts/bench/gpurun_bench_checkpoint_memory "$work/memory" 3 --in-memory)
rm -rf "$work/memory"
"$python" - "$work" "$bytes" "$dd_lines" "$one" "$memory" "$memory_images" <<'PY'
import json, os, re, statistics, sys, time
import numpy as np
import torch
work, nbytes, dd_lines, one = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
memory, memory_images = (dict(line.split() for line in arg.splitlines() if len(line.split()) == 2)
                         for arg in sys.argv[5:7])
def saves(mode):
    return [json.loads(l) for l in open(f"{work}/async-{mode}/metrics.jsonl") if '"event":"checkpoint"' in l]
a, s, tiered = saves("true"), saves("false"), saves("tiered")
# The first async save allocates the copy's bookkeeping; medians over all saves.
stall_async = statistics.median(e["stall_seconds"] for e in a)
stall_sync = statistics.median(e["stall_seconds"] for e in s)  # build and write included
stall_tiered = statistics.median(e["stall_seconds"] for e in tiered)
copies = sum(1 for l in open(f"{work}/async-tiered/metrics.jsonl") if '"event":"checkpoint_copied"' in l)
build = statistics.median(e["build_seconds"] for e in a)
size = statistics.median(e["bytes"] for e in a)
# The writes of both runs: the synchronous ones with training paused, the async ones beside it.
write = statistics.median(e["write_seconds"] for e in a + s)
src = np.ones(nbytes, dtype=np.uint8)
fresh, warm = [], []
dst = np.empty_like(src); np.copyto(dst, src)
for _ in range(3):
    t = time.perf_counter(); c = src.copy(); fresh.append(time.perf_counter() - t); del c
    t = time.perf_counter(); np.copyto(dst, src); warm.append(time.perf_counter() - t)
memcpy_fresh, memcpy_warm = min(fresh), min(warm)
dd_rates = []
for line in dd_lines.splitlines():
    m = re.search(r"(\d+) bytes.* ([\d.]+) s,", line)
    if m:
        dd_rates.append(int(m.group(1)) / float(m.group(2)))
dd_bytes_per_s = statistics.median(dd_rates) if dd_rates else None
print(f"checkpoint size               : {size / 2**20:.1f} MiB ({len(a)} async saves, {len(s)} synchronous)")
print(f"training stall, async         : {stall_async * 1000:8.1f} ms (median; the copy)")
print(f"  then on the writer thread   : {build * 1000:8.1f} ms build (digest), {write * 1000:.1f} ms write (serialization streamed to the files)")
print(f"training stall, synchronous   : {stall_sync * 1000:8.1f} ms (median)")
print(f"memcpy of {nbytes / 2**20:.0f} MiB            : {memcpy_fresh * 1000:8.1f} ms into a fresh buffer, {memcpy_warm * 1000:.1f} ms into a warm one")
print(f"ratio stall async/sync        : {stall_async / stall_sync:.3f}   (goal <= 0.05)")
print(f"ratio stall/memcpy (fresh)    : {stall_async / memcpy_fresh:.2f}   (goal <= 2)")
print(f"ratio stall/memcpy (warm)     : {stall_async / memcpy_warm:.2f}")
print(f"stall, local tier + slow net: {stall_tiered * 1000:8.1f} ms (median; {len(tiered)} saves, {copies} copied to --ckpt)")
print(f"ratio stall slow-net/without: {stall_tiered / stall_async:.2f}   (goal <= 1.1)")
resumes = [json.loads(l) for l in open(f"{work}/async-true/metrics.jsonl") if '"event":"resume"' in l][-2:]
model_pt = os.path.join(one, "model.pt")
py_bytes = os.path.getsize(model_pt)
def py_load_seconds(cold):
    if cold:
        fd = os.open(model_pt, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    t0 = time.perf_counter(); torch.load(model_pt); return time.perf_counter() - t0
for resume, cold in zip(resumes, (True, False)):
    where = "from disk" if cold else "from cache"
    load_seconds = resume["read_seconds"] + resume["restore_seconds"]
    py_load = py_load_seconds(cold)
    print(f"{'gpurun load, ' + where:30}: {resume['bytes'] / load_seconds / 2**20:8.1f} MiB/s ({resume['read_seconds'] * 1000:.0f} ms choosing, {resume['restore_seconds'] * 1000:.0f} ms reading, checking and restoring, {resume['bytes'] / 2**20:.0f} MiB)")
    print(f"{'torch.load, ' + where:30}: {py_bytes / py_load / 2**20:8.1f} MiB/s ({py_load * 1000:.0f} ms, {py_bytes / 2**20:.0f} MiB)")
    print(f"{'ratio load, ' + where:30}: {(resume['bytes'] / load_seconds) / (py_bytes / py_load):.2f}   (goal >= 1.0)")
# The write end to end: the writer thread's build and write, capture excluded. The synchronous
# saves run with training paused, as torch.save runs here: they give the ratios. The async ones
# share the cores with training (2 threads), and are printed beside them.
end_to_end = statistics.median(e["build_seconds"] + e["write_seconds"] for e in s)
end_to_end_async = statistics.median(e["build_seconds"] + e["write_seconds"] for e in a)
gpurun_speed = size / end_to_end
# Python saves the same tensors in three files, each torch.save then fsync: model.pt's state,
# an Adam state of the same shapes (exp_avg and exp_avg_sq of every tensor, as optim.pt), and
# trainer.pt's generator state. Median of 3, each after 5 s at rest.
model_state = torch.load(model_pt)
optim_state = {}
for k, v in model_state.items():
    optim_state[k + ".exp_avg"] = v.clone()
    optim_state[k + ".exp_avg_sq"] = v.clone()
trainer_state = torch.load(os.path.join(one, "trainer.pt"))
py_runs = []
for _ in range(3):
    time.sleep(5)  # at rest, as dd above and as gpurun's saves come after training steps
    t0 = time.perf_counter()
    py_bytes = 0
    for name, state in (("model", model_state), ("optim", optim_state), ("trainer", trainer_state)):
        path = f"{work}/py-{name}.pt"
        with open(path, "wb") as f:
            torch.save(state, f); f.flush(); os.fsync(f.fileno())
        py_bytes += os.path.getsize(path)
    py_runs.append(time.perf_counter() - t0)
    for name in ("model", "optim", "trainer"):
        os.remove(f"{work}/py-{name}.pt")
py_speed = py_bytes / statistics.median(py_runs)
print(f"checkpoint write, end to end  : {gpurun_speed / 2**20:8.1f} MiB/s ({end_to_end * 1000:.0f} ms build + write, median of the {len(s)} synchronous saves; fsync of every file and folder)")
print(f"  beside training (async)     : {size / end_to_end_async / 2**20:8.1f} MiB/s ({end_to_end_async * 1000:.0f} ms, median of {len(a)} saves)")
print(f"Python torch.save + fsync     : {py_speed / 2**20:8.1f} MiB/s (median of 3; {py_bytes / 2**20:.0f} MiB in 3 files)")
print(f"ratio write gpurun/torch.save : {gpurun_speed / py_speed:.2f}   (goal >= 1.0)")
if dd_bytes_per_s:
    print(f"dd conv=fsync throughput      : {dd_bytes_per_s / 2**20:8.1f} MiB/s (median of {len(dd_rates)})")
    print(f"ratio write gpurun/dd         : {gpurun_speed / dd_bytes_per_s:.2f}   (goal >= 0.8)")
above = int(memory["host_bytes_above_buffers"])
print(f"host memory above the buffers : {above / 2**20:8.1f} MiB (peak RSS of a save above the {int(memory['copied_bytes']) / 2**20:.0f} MiB copy, median of 3; {float(memory['seconds']) * 1000:.0f} ms)   (goal <= 64 MiB)")
print(f"  files built in memory first : {int(memory_images['host_bytes_above_buffers']) / 2**20:8.1f} MiB ({float(memory_images['seconds']) * 1000:.0f} ms; how saves were before they were streamed)")
PY

#!/usr/bin/env bash
# Loading a ~1 GB bf16 safetensors model on the CPU, gpurun against PyTorch, side by side in one
# run: seconds and resident memory, from a cold page cache (dropped before each loader's first
# load, as root; otherwise the file is only as cold as the machine left it) and warm (the same
# load once more at once).
#   the model: make_tiny.py's Llama of 32 layers, hidden 1024, intermediate 2816, 8 heads,
#   8 KV heads, vocab 32000, saved by save_pretrained in bfloat16 (477M parameters, 0.95 GB).
#   gpurun: the `weights` event of a run of `model: {name: hf}` in bf16 with optim.master_weights
#   (the model held in bf16, as the file), so the copy converts nothing: its `seconds` (opening
#   and checking the files' headers, then each tensor copied from the memory-mapped file),
#   `resident_peak_bytes` (VmHWM when the copy ends) and `resident_before_model_bytes` (VmRSS
#   before the model is built). The rest of the run is as short as a run gets: a LoRA of rank 1 on
#   one q_proj, 2 samples of 16 tokens, memory.strategy none, a checkpoint at the end.
#   PyTorch, as transformers' own from_pretrained does it, spelt out: the model built on the meta
#   device in bf16 (AutoModelForCausalLM.from_config, not timed), then timed
#   safetensors.torch.load_file of the folder's files and model.load_state_dict(state,
#   assign=True, strict=True). safetensors 0.8's load_file maps the file (backend "mmap", the
#   default) and reads nothing: its tensors are the mapped pages, read at their first use. So the
#   "+ touch" column adds the time to read one byte of every page of every weight (what the first
#   forward pass would wait for), and the peak is taken after it; backend "pread" reads the
#   bytes into memory of its own, as gpurun's copy does. The peak is VmHWM, reset
#   (/proc/self/clear_refs 5) just before the load, over VmRSS just before it (mapped pages of
#   the page cache count once read). For reference, AutoModelForCausalLM.from_pretrained(DIR,
#   dtype=bfloat16), timed whole (the model's construction included).
# Ratios: PyTorch's seconds until the weights are in memory (load + touch) / gpurun's seconds.
# Usage: scripts/bench/hf_load.sh   (GPURUN=path/to/gpurun, default build/runner/gpurun)
set -euo pipefail
cd "$(dirname "$0")/../.."
gpurun=${GPURUN:-build/runner/gpurun}
python=$(scripts/install-deps.sh --print-hf-python)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" tests/tools/hf/make_tiny.py model "$work/llama" --layers 32 --hidden 1024 \
  --intermediate 2816 --heads 8 --kv-heads 8 --vocab 32000 --dtype bfloat16 >/dev/null
"$python" tests/tools/hf/make_tiny.py tokens --tokens "$work/train.bin" --eval-tokens "$work/val.bin" \
  --n-tokens 33 --vocab 32000 >/dev/null
cat >"$work/run.yaml" <<YAML
model: {name: hf, path: $work/llama, lora: {rank: 1, targets: ["model.layers.0.self_attn.q_proj"]}}
data: {name: tokens, path: $work/train.bin, eval_path: $work/val.bin, vocab_size: 32000,
       context: 16, train_samples: 2, eval_samples: 2, workers: 0}
optim: {name: adamw, lr: 0.0001, master_weights: true}
train: {epochs: 1, batch_size: 2, eval_batch_size: 2, precision: bf16}
memory: {strategy: none, probe_steps: 1}
YAML
cat >"$work/load.py" <<'PY'
# load.py mmap|pread|from_pretrained DIR: the load's seconds, the seconds until one byte of every
# page of every weight has been read (the load's included), VmHWM, and VmRSS before the load
import glob, os, sys, time
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM
mode, path = sys.argv[1:3]
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
if mode != "from_pretrained":
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                                 dtype=torch.bfloat16)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
before = status("VmRSS")
start = time.perf_counter()
if mode != "from_pretrained":
    state = {}
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        state.update(load_file(file, backend=mode))
    model.load_state_dict(state, assign=True, strict=True)
else:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
loaded = time.perf_counter() - start
assert not any(p.is_meta for p in model.parameters())
with torch.no_grad():
    for p in model.parameters():
        p.view(-1).view(torch.uint8)[::4096].sum()
touched = time.perf_counter() - start
print(loaded, touched, status("VmHWM"), before)
PY
dropped=no
drop() {  # empties the page cache where this user may
  sync
  if echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then dropped=yes; fi
}
: >"$work/results"
for side in gpurun mmap pread from_pretrained; do
  drop
  for state in cold warm; do
    if [ $side = gpurun ]; then
      run="$work/gpurun-$state"
      "$gpurun" "$work/run.yaml" --ckpt "$run" >"$work/gpurun.log" 2>&1 ||
        { tail -20 "$work/gpurun.log" >&2; exit 1; }
      /usr/bin/python3 - "$run" >>"$work/results" <<PY
import json, sys
e = next(json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"event":"weights"' in l)
print("$side $state", e["seconds"], e["seconds"], e["resident_peak_bytes"],
      e["resident_before_model_bytes"], e["bytes"])
PY
      rm -rf "$run"
    else
      numbers=$("$python" "$work/load.py" $side "$work/llama" 2>"$work/load.err") ||
        { tail -20 "$work/load.err" >&2; exit 1; }
      echo "$side $state $numbers 0" >>"$work/results"
    fi
  done
done
/usr/bin/python3 - "$work/results" $dropped <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    side, state, loaded, touched, peak, before, size = line.split()
    rows[side, state] = float(loaded), float(touched), int(peak), int(before), int(size)
size = rows["gpurun", "cold"][4]
MiB = 2**20
print(f"Llama 32 x 1024, vocab 32000, {size / 1e9:.2f} GB of bf16 safetensors, CPU; cold: page cache "
      + ("dropped" if sys.argv[2] == "yes" else "NOT dropped (not root): as the machine left it"))
print(f"{'load':<35}{'':>5}{'load s':>8}{'+ touch s':>10}{'peak MiB':>10}{'baseline MiB':>14}{'above MiB':>11}")
names = {"gpurun": "gpurun (weights event)",
         "mmap": "load_file + load_state_dict",
         "pread": "load_file(pread) + load_state_dict",
         "from_pretrained": "from_pretrained (reference)"}
for (side, state), (loaded, touched, peak, before, _) in rows.items():
    print(f"{names[side]:<35}{state:>5}{loaded:>8.2f}{touched if side != 'gpurun' else loaded:>10.2f}"
          f"{peak / MiB:>10.0f}{before / MiB:>14.0f}{(peak - before) / MiB:>11.0f}")
for state in ("cold", "warm"):
    g = rows["gpurun", state][0]
    short = {"mmap": "load_file (mmap)", "pread": "load_file (pread)", "from_pretrained": "from_pretrained"}
    print(f"{state}: PyTorch s (+ touch) / gpurun s: "
          + ", ".join(f"{short[side]} {rows[side, state][1] / g:.2f}" for side in short)
          + f"  (goal >= 1.0); load_file (mmap) without the touch {rows['mmap', state][0] / g:.2f}")
for state in ("cold", "warm"):
    g = rows["gpurun", state]
    above = g[2] - g[3]
    print(f"{state}: gpurun resident peak above its baseline: {above / 1e9:.3f} GB = "
          f"{above / size:.2f} x the file  (goal < 1.3 GB: {'met' if above < 1.3e9 else 'NOT met'})")
PY

#!/usr/bin/env bash
# Proves gpurun on one machine, in one command: builds it (from bundle/ alone unless --build-dir
# names a build) against the machine's PyTorch, then measures the CUDA unit tests, the memory
# meter against PyTorch's own counter, fitting under a memory limit, recovery from a real OOM in
# training, an exact resume after SIGKILL, throughput against a plain PyTorch loop, the
# checkpoint stall, NCCL, mixed precision (bf16 against fp32, fp16 resumed exactly) and the
# sharded optimizer (NCCL reduce-scatter and all-gather, master weights, offload). On a
# machine without a GPU, --device cpu runs every row that does not need CUDA and marks the
# others skipped.
#
# Usage: scripts/gpu-check.sh [--device cuda|cpu] [--out DIR] [--build-dir DIR]
#
# The report, DIR/gpu-check.md, is written one row at a time (a run cut short keeps what it
# measured): | check | result | figure |, result pass, fail or skipped. Each run works in a
# folder of its own, DIR/run-DATE-TIME-XXXX/ (logs/: the output of every step; work/: the
# configs, checkpoints and metrics.jsonl of every run it trains): when every row passed, its
# logs replace DIR/logs/ and the folder is removed; a run that failed or was cut short keeps it,
# with a copy of its report, and no later run writes there. Exit status: 0 when no row failed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

device=cuda out=gpu-check-out build_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$device" in cuda|cpu) ;; *) echo "gpu-check: --device must be cuda or cpu" >&2; exit 2 ;; esac
mkdir -p "$out"
out=$(cd "$out" && pwd)
report=$out/gpu-check.md
# This run's own folder: a failure's logs and checkpoints are never overwritten by the next run.
run_dir=$(mktemp -d "$out/run-$(date -u +%Y%m%d-%H%M%S)-XXXX")
logs=$run_dir/logs
work=$run_dir/work
mkdir -p "$logs" "$work"
# A build from bundle/ is large and says nothing a log does not: it goes where it is removed.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-XXXXXX")
failures=0 completed=0
finish() {
  rm -rf "$scratch"
  if [ "$completed" = 1 ] && [ "$failures" -eq 0 ]; then
    rm -rf "$out/logs" && mv "$logs" "$out/logs" && rm -rf "$run_dir"
  else
    cp "$report" "$run_dir/" 2>/dev/null
    echo "gpu-check: failed or cut short; this run's logs and work directory are kept in $run_dir" >&2
  fi
}
trap finish EXIT
start_time=$(date +%s)

row() {  # row CHECK RESULT FIGURE
  printf '| %s | %s | %s |\n' "$1" "$2" "$3" >>"$report"
  printf 'gpu-check: %-44s %-7s %s\n' "$1" "$2" "$3" >&2
  [ "$2" = fail ] && failures=$((failures + 1))
  return 0
}
elapsed() { echo "$(( $(date +%s) - start_time )) s"; }

# The Python whose torch gpurun builds against: the one install-deps.sh chooses (python3's
# when it is >= 2.7, else the venv it set up); this part of it needs no apt and no network.
python=$(scripts/install-deps.sh --print-torch-python 2>/dev/null || true)
json() { "$python" -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {}, {"d": d}))' "$1"; }

{
  echo "# gpurun GPU check ($device), $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "| check | result | figure |"
  echo "|---|---|---|"
} >"$report"

# --- the machine -------------------------------------------------------------------------------
row "host" pass "$(uname -srm); $(ldd --version 2>&1 | head -1 | sed 's/.*) //;s/|/\//g') glibc"
libstdcxx=$(gcc -print-file-name=libstdc++.so.6 2>/dev/null)
row "compiler" pass "$(gcc --version 2>/dev/null | head -1 | tr '|' '/'); libstdc++ $(strings "$libstdcxx" 2>/dev/null | grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -V | tail -1); cmake $(cmake --version | head -1 | awk '{print $3}')"
if [ -z "$python" ]; then
  row "pytorch" fail "no Python with torch >= 2.7 (scripts/install-deps.sh --print-torch-python)"
  exit 1
fi
row "pytorch" pass "$("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "devices", torch.cuda.device_count())')"
gpus=0
if [ "$device" = cuda ]; then
  gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
  if [ "$gpus" -lt 1 ]; then
    row "gpu" fail "torch.cuda.device_count() is 0"
    exit 1
  fi
  row "gpu" pass "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 | tr '|' '/') x $gpus"
fi

# --- build -------------------------------------------------------------------------------------
data=/usr/share/datasets/fashion-mnist
if [ -z "$build_dir" ]; then
  build_dir=$scratch/build
  sysroot=$root/bundle/sysroot
  if [ ! -d "$sysroot" ]; then
    row "build" fail "no bundle/ (run scripts/gpu-bundle.sh on a development machine)"
    exit 1
  fi
  [ -d "$data" ] || data=$sysroot/usr/share/datasets/fashion-mnist
  prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  t0=$(date +%s)
  # The bundle's protoc runs at build time with the bundle's libprotoc and libprotobuf.
  export LD_LIBRARY_PATH="$sysroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-"8.0;9.0"} \
     cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       -DGPURUN_BUILD_TESTS=ON -DGPURUN_BUILD_FUZZ=OFF -DGPURUN_PYTHON="$(command -v "$python")" \
       -DCMAKE_PREFIX_PATH="$prefix;$sysroot/usr" \
       >"$logs/configure.log" 2>&1 &&
     cmake --build "$build_dir" -j"$(nproc)" >"$logs/build.log" 2>&1; then
    row "build from bundle/" pass "$(( $(date +%s) - t0 )) s; $(grep -h 'gpurun: ' "$logs/configure.log" | sed 's/-- gpurun: //' | tr '\n' ';' | tr '|' '/')"
  else
    row "build from bundle/" fail "see logs/configure.log, logs/build.log: $(grep -m1 -E 'error|Error' "$logs/configure.log" "$logs/build.log" | cut -c1-200 | tr '|' '/')"
    exit 1
  fi
else
  build_dir=$(cd "$build_dir" && pwd)
  row "build" pass "reused $build_dir"
fi
gpurun=$build_dir/runner/gpurun
row "gpurun --version" pass "$("$gpurun" --version)"

# A small Fashion-MNIST run config: NAME MODEL-YAML EXTRA-YAML
config() {
  cat >"$work/$1.yaml" <<YAML
model: $2
data: {name: idx, path: $data, train_samples: 2048, eval_samples: 512}
optim: {name: adam, lr: 0.001}
train: {epochs: 2, batch_size: 64, seed: 3}
log: {every_steps: 8}
$3
YAML
  echo "$work/$1.yaml"
}
digest() { "$gpurun" ckpt inspect "$1" --json 2>/dev/null | json 'd["model_digest"]'; }
# What a killed run's resume took: the checkpoint's step, and each process's plan and threads.
resume_of() {
  "$python" - "$1" <<'PY'
import json, sys
events = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if l.endswith("\n")]
resumes = [e["global_step"] for e in events if e["event"] == "resume"]
plans = [f"{e['micro_batch']}x{e['accumulation_steps']}" for e in events if e["event"] == "plan"]
# The resumed process's own comparison with the steps the killed one logged after its checkpoint.
checks = [e for e in events if e["event"] == "resume_check"]
last = checks[-1] if checks else {}
check = ("none" if not checks
         else f"not made ({last.get('reason', '?')})" if "exact" not in last
         else f"exact over steps {last['first_step']}-{last['last_step']}" if last["exact"]
         else f"differs at step {last['global_step']}: {last['loss']!r} vs {last['logged_loss']!r} logged before the kill")
print(f"resumed at step {resumes[-1] if resumes else 'none'}, plans {' '.join(plans)}, resume check {check}")
PY
}

# --- 1. CUDA unit tests ------------------------------------------------------------------------
if [ "$device" = cuda ]; then
  if "$build_dir/tests/gpurun_unit_tests" --gtest_filter='*_CUDA' >"$logs/cuda-unit.log" 2>&1; then
    row "1. CUDA unit tests" pass "$(grep -c '^\[       OK \]' "$logs/cuda-unit.log") passed"
  else
    row "1. CUDA unit tests" fail "$(grep '^\[  FAILED  \]' "$logs/cuda-unit.log" | head -3 | tr '\n' ' ')"
  fi
else
  row "1. CUDA unit tests" skipped "no GPU (--device cpu)"
fi

# --- 2. the meter against torch.cuda.max_memory_allocated --------------------------------------
if [ "$device" = cuda ]; then
  ours=$("$build_dir/scripts/bench/gpurun_bench_meter" cuda 2>"$logs/meter.log" | tail -1)
  theirs=$("$python" "$root/scripts/bench/meter_reference.py" 2>>"$logs/meter.log" | tail -1)
  if [ -n "$ours" ] && [ -n "$theirs" ]; then
    diff=$("$python" -c "print(abs($ours - $theirs) / $theirs)")
    result=$("$python" -c "print('pass' if $diff <= 0.01 else 'fail')")
    row "2. meter peak vs torch.cuda.max_memory_allocated" "$result" "$ours vs $theirs bytes ($(printf %.3f "$("$python" -c "print($diff*100)")")%)"
  else
    row "2. meter peak vs torch.cuda.max_memory_allocated" fail "see logs/meter.log"
  fi
else
  row "2. meter peak vs torch.cuda.max_memory_allocated" skipped "no GPU (--device cpu)"
fi

# --- 3. fit under a memory limit, global batch kept --------------------------------------------
# The CNN at batch 256: activations, which a smaller micro-batch shrinks, outweigh the weights
# and optimizer state, which no plan shrinks (an MLP's would not fit at 60% with micro-batch 1).
cfg=$(config fit "{name: cnn}" "")
batch256=(--set train.batch_size=256 --set train.epochs=1)
need=$("$gpurun" plan "$cfg" --device "$device" "${batch256[@]}" --json 2>"$logs/fit-plan.log" |
  json 'd["measured_peak_bytes"]')
if [ -n "$need" ]; then
  limit=$(( need * 6 / 10 ))
  if "$gpurun" "$cfg" --ckpt "$work/fit" --device "$device" --memory-limit "$limit" \
       "${batch256[@]}" >"$logs/fit.log" 2>&1; then
    verdict=$("$python" - "$work/fit/metrics.jsonl" "$limit" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
plan = [e for e in events if e["event"] == "plan"][-1]
peak = max(e["peak_bytes"] for e in events if e["event"] == "epoch")
ok = peak <= int(sys.argv[2]) and plan["global_batch"] == 256 and \
     plan["micro_batch"] * plan["accumulation_steps"] * plan["world_size"] == 256
print("pass" if ok else "fail", f"limit {sys.argv[2]} B, epoch peak {peak} B, micro-batch "
      f"{plan['micro_batch']} x accumulation {plan['accumulation_steps']}, checkpointing "
      f"{plan['activation_checkpointing']}, global batch {plan['global_batch']}")
PY
)
    row "3. --memory-limit 60% of the need" "${verdict%% *}" "${verdict#* }"
  else
    row "3. --memory-limit 60% of the need" fail "exit $?; see logs/fit.log"
  fi
else
  row "3. --memory-limit 60% of the need" fail "gpurun plan failed; see logs/fit-plan.log"
fi

# --- 4. a real OOM in training, recovered by halving -------------------------------------------
# After optimizer step 4 the trainer (GPURUN_FAULT=hog) takes the memory its limit leaves free,
# less half of what a step adds, so that step 5's allocations fail for real in the allocator
# (CUDA's caching allocator under its memory fraction, or gpurun's CPU allocator under
# --memory-limit); the trainer must free what failed, halve the micro-batch and go on.
# The same CNN: an OOM in the optimizer's update (weights, not activations) could not be
# retried, since part of the parameters would already be updated.
cfg=$(config oom "{name: cnn}" "")
if [ -n "${need:-}" ]; then
  GPURUN_FAULT="hog:after_step:4" "$gpurun" "$cfg" --ckpt "$work/oom" --device "$device" \
    --memory-limit $(( need * 2 )) "${batch256[@]}" >"$logs/oom.log" 2>&1
  code=$?
  verdict=$("$python" - "$work/oom/metrics.jsonl" "$code" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])] if sys.argv[2] == "0" else []
plans = [e for e in events if e["event"] == "plan"]
ok = len(plans) >= 2 and plans[-1]["micro_batch"] < plans[0]["micro_batch"] and \
     plans[-1]["micro_batch"] * plans[-1]["accumulation_steps"] == plans[0]["global_batch"]
print("pass" if ok else "fail", f"exit {sys.argv[2]}; micro-batch " +
      " -> ".join(f"{p['micro_batch']} x {p['accumulation_steps']}" for p in plans) +
      (f", global batch {plans[0]['global_batch']} kept" if ok else ""))
PY
)
  row "4. real OOM in training, recovered" "${verdict%% *}" "${verdict#* }"
else
  row "4. real OOM in training, recovered" fail "no measured need from row 3"
fi

# --- 5. SIGKILL mid-epoch, resume, equal model_digest ------------------------------------------
cfg=$(config resume "{name: cnn}" "checkpoint: {every_steps: 8}")
"$gpurun" "$cfg" --ckpt "$work/whole" --device "$device" >"$logs/resume-whole.log" 2>&1
whole=$?
# In a subshell, so that the shell does not print "Killed" for the expected SIGKILL.
(GPURUN_FAULT=sigkill:after_step:21 exec "$gpurun" "$cfg" --ckpt "$work/killed" --device "$device" \
  >"$logs/resume-killed.log" 2>&1)
killed=$?
"$gpurun" "$cfg" --ckpt "$work/killed" --device "$device" --resume >"$logs/resume-resumed.log" 2>&1
resumed=$?
a=$(digest "$work/whole") b=$(digest "$work/killed")
# A run that did not finish leaves an earlier checkpoint's digest: the exits say which.
if [ "$whole" -eq 0 ] && [ "$killed" -eq 137 ] && [ "$resumed" -eq 0 ] && [ -n "$a" ] &&
   [ "$a" = "$b" ]; then
  row "5. SIGKILL at step 21, resume" pass "model_digest $a = uninterrupted ($(resume_of "$work/killed"))"
else
  row "5. SIGKILL at step 21, resume" fail "exits $whole (whole), $killed (killed), $resumed (resumed); digests ${a:-none} vs ${b:-none}; $(resume_of "$work/killed")"
fi

# --- 6. throughput against a plain PyTorch loop ------------------------------------------------
if [ "$device" = cuda ]; then hidden="[4096, 4096, 4096]" batch=512 steps=200
else hidden="[1024, 1024]" batch=128 steps=60; fi
cfg=$(config speed "{name: mlp, hidden: $hidden}" "")
"$gpurun" "$cfg" --ckpt "$work/speed" --device "$device" --set train.epochs=1 \
  --set data.train_samples=$((batch * steps)) --set train.batch_size=$batch \
  --set log.every_steps=10 >"$logs/speed.log" 2>&1
ours=$("$python" - "$work/speed/metrics.jsonl" <<'PY'
import json, sys, statistics
steps = [json.loads(l) for l in open(sys.argv[1]) if '"event":"step"' in l]
print(statistics.median(e["samples_per_second"] for e in steps[1:]) if len(steps) > 1 else "")
PY
)
theirs=$("$python" "$root/scripts/bench/plain_pytorch.py" --device "$device" --data "$data" \
  --hidden "$hidden" --batch "$batch" --steps "$steps" 2>>"$logs/speed.log" | tail -1)
if [ -n "$ours" ] && [ -n "$theirs" ]; then
  row "6. samples/s, gpurun vs PyTorch loop" pass "$(printf '%.0f vs %.0f (ratio %.2f), MLP 784-%s, batch %s' "$ours" "$theirs" "$("$python" -c "print($ours/$theirs)")" "$(echo "$hidden" | tr -d '[] ' | tr , -)" "$batch")"
else
  row "6. samples/s, gpurun vs PyTorch loop" fail "see logs/speed.log"
fi

# --- 7. checkpoint stall against a synchronous save --------------------------------------------
cfg=$(config stall "{name: mlp, hidden: [2048, 2048]}" "checkpoint: {every_steps: 4, keep_last: 2}")
for mode in true false; do
  "$gpurun" "$cfg" --ckpt "$work/stall-$mode" --device "$device" --set train.epochs=1 \
    --set checkpoint.async=$mode >"$logs/stall-$mode.log" 2>&1
done
verdict=$("$python" - "$work" <<'PY'
import json, statistics, sys
def stalls(mode):
    return [json.loads(l)["stall_seconds"] for l in open(f"{sys.argv[1]}/stall-{mode}/metrics.jsonl")
            if '"event":"checkpoint"' in l]
a, s = stalls("true"), stalls("false")
if not a or not s:
    print("fail no checkpoint events")
else:
    ra, rs = statistics.median(a), statistics.median(s)
    print(f"pass async {ra * 1000:.1f} ms vs synchronous {rs * 1000:.1f} ms (ratio {ra / rs:.3f}, medians of {len(a)} and {len(s)})")
PY
)
# A verdict that itself failed (a run left no metrics) is a failed row, not an empty one.
[ -n "$verdict" ] || verdict="fail no verdict (a run left no metrics.jsonl); see logs/"
row "7. checkpoint stall, async vs synchronous" "${verdict%% *}" "${verdict#* }"

# --- 8. NCCL -----------------------------------------------------------------------------------
if [ "$device" = cuda ]; then
  if "$build_dir/tests/gpurun_unit_tests" --gtest_filter='Collectives.Nccl*' >"$logs/nccl.log" 2>&1 &&
     grep -q '^\[       OK \]' "$logs/nccl.log"; then
    row "8a. NCCL, 1 rank" pass "all-reduce and broadcast through ProcessGroupNCCL"
  else
    row "8a. NCCL, 1 rank" fail "see logs/nccl.log"
  fi
  if [ "$gpus" -ge 2 ]; then
    cfg=$(config nccl "{name: mlp, hidden: [256]}" "")
    if "$gpurun" "$cfg" --ckpt "$work/nccl2" --device cuda --nproc-per-node 2 \
         --set train.epochs=1 >"$logs/nccl2.log" 2>&1; then
      row "8b. NCCL, 2 ranks" pass "digest $(digest "$work/nccl2")"
    else
      row "8b. NCCL, 2 ranks" fail "see logs/nccl2.log"
    fi
  else
    row "8b. NCCL, 2 ranks" skipped "one GPU"
  fi
else
  row "8. NCCL" skipped "no GPU (--device cpu)"
fi

# --- 9. mixed precision: fp16 with the gradient scaler resumed exactly, bf16 against fp32 ------
# Every checkpoint kept: a resume that ends elsewhere is traced to the first step where the two
# runs' saved states part.
cfg=$(config amp "{name: cnn, batch_norm: true}" "checkpoint: {every_steps: 8, keep_last: 16}")
for p in fp32 bf16; do
  "$gpurun" "$cfg" --ckpt "$work/amp-$p" --device "$device" --set train.precision=$p \
    >"$logs/amp-$p.log" 2>&1
done
# fp16 convolutions are slow on a CPU (LibTorch has no fast kernels there): the MLP instead.
# A step event every step: the resume check compares the steps logged between the checkpoint and
# the kill.
amp=(--set train.precision=fp16 --set train.accumulation_steps=2 --set log.every_steps=1)
[ "$device" = cpu ] && amp+=(--set model.name=mlp)
"$gpurun" "$cfg" --ckpt "$work/amp-fp16" --device "$device" "${amp[@]}" >"$logs/amp-fp16.log" 2>&1
exits="$? "
(GPURUN_FAULT=sigkill:after_step:21 exec "$gpurun" "$cfg" --ckpt "$work/amp-killed" \
  --device "$device" "${amp[@]}" >"$logs/amp-killed.log" 2>&1)
exits+="$? "
"$gpurun" "$cfg" --ckpt "$work/amp-killed" --device "$device" "${amp[@]}" --resume \
  >"$logs/amp-resumed.log" 2>&1
exits+="$?"
verdict=$("$python" - "$work" "$(digest "$work/amp-fp16")" "$(digest "$work/amp-killed")" "$exits" \
  "$(resume_of "$work/amp-killed")" <<'PY'
import glob, json, sys
work, whole, killed, exits, resume = sys.argv[1:6]
def accuracy(p):
    epochs = [json.loads(l) for l in open(f"{work}/amp-{p}/metrics.jsonl") if '"event":"epoch"' in l]
    return epochs[-1]["eval_accuracy"] if epochs else None
def seconds(p):
    return sum(json.loads(l)["seconds"] for l in open(f"{work}/amp-{p}/metrics.jsonl") if '"event":"epoch"' in l)
a32, a16 = accuracy("fp32"), accuracy("bf16")
# A run that did not finish leaves an earlier checkpoint's digest: the exits say which.
finished = exits.split() == ["0", "137", "0"]
ok = a32 is not None and a16 is not None and abs(a32 - a16) <= 0.02 and whole and whole == killed and finished
def saved(p):
    """step -> (model digest, scaler state, skipped steps) of every checkpoint the run kept."""
    out = {}
    for folder in glob.glob(f"{work}/amp-{p}/ckpt-e*-s*"):
        try:
            m = json.load(open(f"{folder}/manifest.json"))
        except (OSError, ValueError):
            continue
        x = m.get("extra", {})
        out[m["global_step"]] = (m["model_digest"], x.get("grad_scaler"), x.get("skipped_steps"))
    return out
def parted():
    """Where the uninterrupted and the killed-and-resumed run's checkpoints first differ: before
    the kill the two fresh runs already differ (not the resume); after it, the resume does."""
    a, b = saved("fp16"), saved("killed")
    both = sorted(set(a) & set(b))
    first = next((s for s in both if a[s] != b[s]), None)
    if first is None:
        return f"; their checkpoints at steps {both} agree"
    what = "digest" if a[first][0] != b[first][0] else "scaler state or skipped steps"
    return (f"; first checkpoint that differs: step {first} ({what}: {a[first]} vs {b[first]}), "
            + ("before the kill: the fresh runs differ" if first <= 21 else "after the resume"))
print(("pass" if ok else "fail") + f" bf16 accuracy {a16} vs fp32 {a32} ({seconds('fp32') / max(seconds('bf16'), 1e-9):.2f}x speed); fp16 + accumulation 2 SIGKILLed and resumed: digest {killed or 'none'} vs {whole or 'none'}" + ("" if finished else f", exits {exits} (whole, killed, resumed; expected 0 137 0)") + f", {resume}" + ("" if ok or not whole or not killed else parted()))
PY
)
# A verdict that itself failed (a run left no metrics) is a failed row, not an empty one.
[ -n "$verdict" ] || verdict="fail no verdict (a run left no metrics.jsonl); see logs/"
row "9. bf16 vs fp32, fp16 resume" "${verdict%% *}" "${verdict#* }"

# --- 10. the sharded optimizer: NCCL reduce-scatter and all-gather, master weights, offload ---
if [ "$device" = cuda ]; then
  if "$build_dir/tests/gpurun_unit_tests" --gtest_filter='FlatOptimizer.*_CUDA' >"$logs/flat.log" 2>&1 &&
     grep -q '^\[       OK \]' "$logs/flat.log"; then
    row "10a. sharded step over NCCL, 1 rank" pass "reduce-scatter, all-gather, bf16 master weights, offload vs replicated"
  else
    row "10a. sharded step over NCCL, 1 rank" fail "see logs/flat.log"
  fi
  cfg=$(config shard "{name: mlp, hidden: [256]}" "")
  shard=(--set distributed.shard=optimizer --set train.precision=bf16 --set optim.master_weights=true)
  if "$gpurun" "$cfg" --ckpt "$work/shard1" --device cuda "${shard[@]}" --set train.epochs=1 \
       >"$logs/shard1.log" 2>&1 &&
     "$gpurun" "$cfg" --ckpt "$work/shard1-offload" --device cuda "${shard[@]}" \
       --set optim.offload=host --set train.epochs=1 >"$logs/shard1-offload.log" 2>&1; then
    row "10b. sharded run, 1 rank, master weights; with offload" pass "digests $(digest "$work/shard1") / $(digest "$work/shard1-offload")"
  else
    row "10b. sharded run, 1 rank, master weights; with offload" fail "see logs/shard1*.log"
  fi
  if [ "$gpus" -ge 2 ]; then
    if "$gpurun" "$cfg" --ckpt "$work/shard2" --device cuda --nproc-per-node 2 "${shard[@]}" \
         --set train.epochs=1 >"$logs/shard2.log" 2>&1; then
      row "10c. sharded run, 2 ranks" pass "digest $(digest "$work/shard2")"
    else
      row "10c. sharded run, 2 ranks" fail "see logs/shard2.log"
    fi
  else
    row "10c. sharded run, 2 ranks" skipped "one GPU"
  fi
else
  row "10. sharded optimizer on NCCL" skipped "no GPU (--device cpu)"
fi

# --- 11. the loader on CUDA: workers 2 against the training thread's own fetches --------------
# The example's CNN with data.workers 0 and 2: the data wait per optimizer step (the step
# events' data_wait_seconds) against the step time, and the same digest (the workers change
# nothing that is learned). With workers the batches come from pinned memory, copied on a side
# stream one batch ahead (data/loader.h); Loader.*_CUDA of row 1 checks those copies' contents.
if [ "$device" = cuda ]; then
  cfg=$(config loader "{name: cnn, channels: [32, 64], batch_norm: true}" "")
  for workers in 0 2; do
    "$gpurun" "$cfg" --ckpt "$work/loader-$workers" --device cuda --set train.epochs=1 \
      --set data.train_samples=6400 --set log.every_steps=10 --set data.workers=$workers \
      >"$logs/loader-$workers.log" 2>&1
  done
  verdict=$("$python" - "$work" "$(digest "$work/loader-0")" "$(digest "$work/loader-2")" <<'PY'
import json, sys
def wait_and_step(workers):
    steps = [json.loads(l) for l in open(f"{sys.argv[1]}/loader-{workers}/metrics.jsonl")
             if '"event":"step"' in l]
    first, last = steps[0], steps[-1]
    n = last["global_step"] - first["global_step"]
    wait = sum(b["data_wait_seconds"] * (b["global_step"] - a["global_step"])
               for a, b in zip(steps, steps[1:])) / n
    return wait, (last["time"] - first["time"]) / n
w0, s0 = wait_and_step(0)
w2, s2 = wait_and_step(2)
same = sys.argv[2] and sys.argv[2] == sys.argv[3]
print(f"{'pass' if same and w2 / s2 <= 0.01 else 'fail'} workers 2: wait {w2 * 1e3:.3f} ms of a "
      f"{s2 * 1e3:.2f} ms step ({w2 / s2:.4f}); workers 0: {w0 * 1e3:.3f} ms of {s0 * 1e3:.2f} ms "
      f"({w0 / s0:.4f}); digests {'equal' if same else 'differ'}")
PY
)
  [ -n "$verdict" ] || verdict="fail no verdict (a run left no metrics.jsonl); see logs/loader-*.log"
  row "11. loader, workers 2 on CUDA: data wait per step" "${verdict%% *}" "${verdict#* }"
else
  row "11. loader, workers 2 on CUDA: data wait per step" skipped "no GPU (--device cpu)"
fi

row "total" "$([ $failures -eq 0 ] && echo pass || echo fail)" "$failures failed rows, $(elapsed)"
completed=1
[ "$failures" -eq 0 ]

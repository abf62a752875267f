#!/usr/bin/env bash
# Fault injection: each trial kills gpurun at a random moment (SIGKILL from outside once a random
# step's event is in metrics.jsonl, or from inside right after an optimizer step, before a
# checkpoint folder's rename,
# before LATEST is replaced, or right after a background write completed), then runs the same
# `--resume` line until the run finishes. Every trial must end with the uninterrupted run's
# model_digest. Prints "N passed, M failed"; exits 1 when any trial failed.
#
# Usage: scripts/fault-inject.sh [TRIALS=30] [SEED]
#   GPURUN=path/to/gpurun (default build/runner/gpurun)
set -uo pipefail
cd "$(dirname "$0")/.."
trials=${1:-30}
RANDOM=${2:-$$}
gpurun=${GPURUN:-build/runner/gpurun}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat >"$work/run.yaml" <<'YAML'
model: {name: mlp, hidden: [256, 128]}
data: {name: idx, train_samples: 1200, eval_samples: 200}
optim: {name: adam, lr: 0.001}
schedule: {name: cosine, warmup_steps: 5}
train: {epochs: 2, batch_size: 40, eval_batch_size: 200, seed: 3, threads: 1}
checkpoint: {every_steps: 3, keep_last: 2}
log: {every_steps: 1}
YAML
steps=60  # 1200 / 40 x 2 epochs

"$gpurun" "$work/run.yaml" --ckpt "$work/reference" 2>"$work/reference.log" ||
  { echo "the uninterrupted run failed:"; tail -5 "$work/reference.log"; exit 1; }
expected=$("$gpurun" ckpt inspect "$work/reference" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["model_digest"])')

# Whether `pid` still runs (a zombie, exited but not yet waited for, does not).
alive() { local state; state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null); [ -n "$state" ] && [ "$state" != Z ]; }

passed=0 failed=0
for ((t = 1; t <= trials; t++)); do
  dir="$work/trial$t"
  case $((RANDOM % 5)) in
    0) fault="" ; kill_at=$((RANDOM % steps + 1)) ;;
    1) fault="sigkill:after_step:$((RANDOM % steps + 1))" ;;
    2) fault="sigkill:before_rename:$((RANDOM % 12 + 1))" ;;
    3) fault="sigkill:before_latest:$((RANDOM % 12 + 1))" ;;
    4) fault="sigkill:after_save:$((RANDOM % 12 + 1))" ;;
  esac
  what=${fault:-"SIGKILL from outside once step $kill_at is logged"}
  if [ -n "$fault" ]; then
    GPURUN_FAULT=$fault "$gpurun" "$work/run.yaml" --ckpt "$dir" --resume 2>"$dir.log"
  else
    "$gpurun" "$work/run.yaml" --ckpt "$dir" --resume 2>"$dir.log" &
    pid=$!
    # The run's own event, never a fixed time: a faster BLAS or a GPU would have finished, a
    # loaded machine would still be planning (metrics.jsonl has a step event for every step).
    for ((i = 0; i < 12000; i++)); do
      grep -qE "\"event\":\"step\",\"global_step\":$kill_at[,}]" "$dir/metrics.jsonl" 2>/dev/null && break
      alive $pid || break
      sleep 0.01
    done
    kill -KILL $pid 2>/dev/null
    wait $pid 2>/dev/null  # no "Killed" line for the expected SIGKILL
  fi
  first=$?
  rc=1
  for attempt in 1 2 3; do
    "$gpurun" "$work/run.yaml" --ckpt "$dir" --resume 2>>"$dir.log" && { rc=0; break; }
  done
  digest=$("$gpurun" ckpt inspect "$dir" --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["model_digest"])' 2>/dev/null)
  if [ $rc -eq 0 ] && [ "$digest" = "$expected" ]; then
    passed=$((passed + 1))
    echo "trial $t: $what (first exit $first): ok"
  else
    failed=$((failed + 1))
    echo "trial $t: $what (first exit $first): FAILED: resume exit $rc, digest $digest != $expected"
    tail -5 "$dir.log"
  fi
  rm -rf "$dir"
done
echo "fault injection: $passed of $trials trials ended with the uninterrupted digest"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

#!/usr/bin/env bash
# tokens batches/s ÷ nanoGPT's get_batch, side by side in one run on this machine (issue 30).
#
# One raw uint16 token file: the King James Bible, one token per byte, 12 times over (103 MB),
# in the page cache for both. gpurun: Dataset::get_batch of the tokens data set with random
# windows (scripts/bench/tokens_batches.cpp, one thread, no model). Python: nanoGPT's
# train.py get_batch as written there: np.memmap re-created per batch, torch.randint offsets,
# torch.stack of torch.from_numpy(... .astype(np.int64)) for inputs and targets, one thread.
# Both at nanoGPT's defaults (batch 12, context 1024) and at batch 64, context 256.
# Usage: scripts/bench/tokens.sh [BATCHES]   (default 3000 a side; needs a build)
set -euo pipefail
cd "$(dirname "$0")/../.."
batches=${1:-3000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python=$(scripts/install-deps.sh --print-torch-python)
kjv=/usr/local/share/gpurun/kjv.txt
[ -s "$kjv" ] || { echo "tokens.sh: no $kjv: run scripts/install-deps.sh" >&2; exit 2; }
"$python" - "$kjv" "$work/train.bin" <<'PY'
import sys, numpy as np
ids = np.fromfile(sys.argv[1], dtype=np.uint8).astype(np.uint16)
np.tile(ids, 12).tofile(sys.argv[2])
PY
cat "$work/train.bin" >/dev/null  # into the page cache for both sides
echo "token file: $(stat -c %s "$work/train.bin") bytes, $batches batches a side, 1 thread"
for shape in "12 1024" "64 256"; do
  set -- $shape
  cpp=$(build/scripts/bench/gpurun_bench_tokens "$work/train.bin" "$1" "$2" "$batches" 2>/dev/null)
  "$python" - "$work/train.bin" "$1" "$2" "$batches" "$cpp" <<'PY'
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
path, batch_size, block_size, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cpp = json.loads(sys.argv[5])
def get_batch():
    # nanoGPT train.py: "We recreate np.memmap every batch to avoid a memory leak"
    data = np.memmap(path, dtype=np.uint16, mode='r')
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i+block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i+1:i+1+block_size]).astype(np.int64)) for i in ix])
    return x, y
for _ in range(batches // 10 + 1):
    get_batch()
start = time.perf_counter()
for _ in range(batches):
    get_batch()
py = batches / (time.perf_counter() - start)
g = cpp["batches_per_second"]
print(f"batch {batch_size:3d} x context {block_size:4d}: gpurun {g:9.1f} batches/s, "
      f"numpy memmap get_batch {py:9.1f} batches/s, ratio {g / py:6.2f}   (goal >= 1.0)")
PY
done

#!/usr/bin/env bash
# The analytic memory estimate (memory/peak_probe.h) against the measured peak of the training
# step, side by side in one run, on the four built-in models (mlp, cnn, resnet, gpt) under fp32
# and bf16: `gpurun plan --json` probes real training steps and prints both. Then the 7B gpt
# (context 2048, bf16, AdamW) from the estimate alone (--estimate-only): its breakdown at
# micro-batch 1 without and with activation checkpointing, next to the 14/56/20 GB rule of
# thumb. Usage: scripts/bench/estimate.sh   Needs a build (scripts/build.sh). About 2 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
gpurun=build/runner/gpurun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
kjv=/usr/local/share/gpurun/kjv.txt
mnist="data: {name: idx, path: /usr/share/datasets/fashion-mnist, train_samples: 2000, eval_samples: 500}"
cat >"$work/mlp.yaml" <<YAML
model: {name: mlp, hidden: [512, 256]}
$mnist
optim: {name: adamw, lr: 0.001}
train: {epochs: 1, batch_size: 128}
YAML
cat >"$work/cnn.yaml" <<YAML
model: {name: cnn, channels: [32, 64], batch_norm: true, dropout: 0.25}
$mnist
optim: {name: adam, lr: 0.001}
train: {epochs: 1, batch_size: 64}
YAML
cat >"$work/resnet.yaml" <<YAML
model: {name: resnet, channels: [16, 32], blocks: [1, 1]}
$mnist
optim: {name: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 1, batch_size: 64}
YAML
cat >"$work/gpt.yaml" <<YAML
model: {name: gpt, layers: 4, heads: 4, width: 64, dropout: 0.1}
data: {name: text, path: $kjv, context: 64, train_samples: 1000, eval_samples: 100}
optim: {name: adamw, lr: 0.002}
train: {epochs: 1, batch_size: 32}
YAML
printf '%-7s %-5s %12s %12s %8s\n' model prec measured estimated error
for m in mlp cnn resnet gpt; do
  for p in fp32 bf16; do
    "$gpurun" plan "$work/$m.yaml" --set train.precision=$p --json 2>/dev/null |
      python3 -c "
import json, sys
j = json.load(sys.stdin); m = j['measured_peaks']['training']; e = j['breakdown']['total']
print('%-7s %-5s %9.2f MiB %9.2f MiB %+7.1f%%' % ('$m', '$p', m / 2**20, e / 2**20, 100 * (e - m) / m))"
  done
done
cat >"$work/gpt7b.yaml" <<YAML
model: {name: gpt, layers: 32, heads: 32, width: 4096, dropout: 0}
data: {name: text, path: $kjv, context: 2048, train_samples: 1000, eval_samples: 100}
optim: {name: adamw, lr: 0.0003}
train: {epochs: 1, batch_size: 1, precision: bf16}
YAML
echo
echo "gpt 32 x 4096, context 2048, bf16, AdamW, micro-batch 1, from the estimate alone:"
"$gpurun" plan "$work/gpt7b.yaml" --estimate-only --json 2>/dev/null | python3 -c "
import json, sys
j = json.load(sys.stdin); G = 1e9
print('  parameters %.2f B; planned in %.1f s, %.0f MB resident' % (
    j['parameters']['total'] / 1e9, j['seconds'], j['host_peak_rss_bytes'] / 1e6))
for k, name in (('breakdown', 'plain'), ('breakdown_checkpointed', 'activation checkpointing')):
    b = j[k]
    print('  %-25s weights %.1f GB, gradients %.1f GB, optimizer state %.1f GB, bf16 weight copies %.1f GB, activations %.1f GB: %.1f GB' % (
        name, b['parameters'] / G, b['gradients'] / G, b['optimizer_state'] / G, b['weight_casts'] / G, b['activations'] / G, b['total'] / G))
print('  rule of thumb: weights 14 GB, optimizer state and gradients 56 GB, activations about 20 GB: about 90 GB')"

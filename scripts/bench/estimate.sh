#!/usr/bin/env bash
# The analytic memory estimate (memory/peak_probe.h) against the measured peak of the training
# step, side by side in one run, on the four built-in models (mlp, cnn, resnet, gpt) under fp32
# and bf16: `gpurun plan --json` probes real training steps and prints both. Then the 7B gpt
# (context 2048, bf16, AdamW, clipping at 1.0 as LLM recipes do) from the estimate alone (--estimate-only): its breakdown at
# micro-batch 1 without and with activation checkpointing, next to the 14/56/20 GB rule of
# thumb, and per rank of 1, 2, 4 and 8 cards under every optimizer placement (distributed.shard,
# optim.master_weights, optim.offload), with the cards_to_fit of the 80 GB cards.
# Usage: scripts/bench/estimate.sh   Needs a build (scripts/build.sh). About 2 minutes.
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
optim: {name: adamw, lr: 0.0003, grad_clip: 1.0}
train: {epochs: 1, batch_size: 8, precision: bf16}
YAML
echo
echo "gpt 32 x 4096, context 2048, bf16, AdamW, micro-batch 1, from the estimate alone:"
"$gpurun" plan "$work/gpt7b.yaml" --estimate-only --set train.batch_size=1 --json 2>/dev/null | python3 -c "
import json, sys
j = json.load(sys.stdin); G = 1e9
print('  parameters %.2f B; planned in %.1f s, %.0f MB resident' % (
    j['parameters']['total'] / 1e9, j['seconds'], j['host_peak_rss_bytes'] / 1e6))
for k, name in (('breakdown', 'plain'), ('breakdown_checkpointed', 'activation checkpointing')):
    b = j[k]
    print('  %-25s weights %.1f GB, gradients %.1f GB, optimizer state %.1f GB, bf16 weight copies %.1f GB, activations %.1f GB: %.1f GB' % (
        name, b['parameters'] / G, b['gradients'] / G, b['optimizer_state'] / G, b['weight_casts'] / G, b['activations'] / G, b['total'] / G))
print('  rule of thumb: weights 14 GB, optimizer state and gradients 56 GB, activations about 20 GB: about 90 GB')"
echo
echo "the same, per rank of N, with activation checkpointing at micro-batch 1 (gpurun plan --estimate-only"
echo "--world-size N --json: modes[].card_bytes and host_bytes; master weights: optim.master_weights: true):"
echo
echo "| cards N | replicated (DDP) | optimizer | gradients | optimizer + master weights | + offload: card / host |"
echo "|---|---|---|---|---|---|"
for n in 1 2 4 8; do
  "$gpurun" plan "$work/gpt7b.yaml" --estimate-only --world-size $n --json 2>/dev/null | python3 -c "
import json, sys
j = json.load(sys.stdin); G = 1e9
m = {x['name']: x for x in j['modes']}
card = lambda name: '%.1f GB' % (m[name]['card_bytes'] / G)
o = m['optimizer + master weights + offload']
print('| %d | %s | %s | %s | %s | %.1f GB / %.1f GB |' % ($n, card('replicated'), card('optimizer'), card('gradients'),
      card('optimizer + master weights'), o['card_bytes'] / G, o['host_bytes'] / G))"
done
echo
echo "80 GB cards of the bundled table, with optim.master_weights: true (cards_to_fit; one card with offload):"
"$gpurun" plan "$work/gpt7b.yaml" --estimate-only --set optim.master_weights=true --json 2>/dev/null | python3 -c "
import json, sys
j = json.load(sys.stdin); G = 1e9
for c in j['cards']:
    if c['memory_bytes'] != 80 * 10**9: continue
    o = c['offload']
    print('  %-10s cards_to_fit %s (%.1f GB a card); one card with offload: %s, %.1f GB on the card, %.1f GB of host memory' % (
        c['name'], c['cards_to_fit'], (c['cards_to_fit_bytes'] or 0) / G, 'fits' if o['fits'] else 'does not fit', o['card_bytes'] / G, o['host_bytes'] / G))"

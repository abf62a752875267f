#!/usr/bin/env bash
# image_folder's loader alone (decode, augment, collate; no model) against torchvision's
# ImageFolder + DataLoader, side by side in one run, on the same folder of JPEGs and the same
# transforms: RandomResizedCrop(224) (bilinear, antialias), RandomHorizontalFlip, ToTensor,
# Normalize(ImageNet's mean and std); batches of 64.
#
# The JPEGs (COUNT, default 20000, 400x300, quality 90) are made from Fashion-MNIST's training
# images, upscaled, tinted per class, with noise (gpurun_bench_image_folder make): Debian ships
# no package of photographs this machine has.
# gpurun: 1 and 2 threads calling Dataset::get_batch on alternate batches (what the loader's
# workers do). torchvision: DataLoader(num_workers=1 and 2), persistent workers off, torch
# threads 1 in each worker (its default). torchvision 0.26.0 (the release for torch 2.11.0) is
# installed from PyPI into a virtual environment of this benchmark alone, which sees the torch
# of scripts/install-deps.sh through a .pth file.
# Usage: scripts/bench/image_folder.sh [COUNT]   Needs a build (gpurun_bench_image_folder) and,
# for the decoder comparison, libspng-dev besides the decoders gpurun links.
set -euo pipefail
cd "$(dirname "$0")/../.."
count=${1:-20000}
torch_python=$(scripts/install-deps.sh --print-torch-python)
venv=${GPURUN_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gpurun/bench-torchvision-0.26.0}
if ! "$venv/bin/python" -c "import torchvision" 2>/dev/null; then
  python3 -m venv "$venv"
  site=$("$torch_python" -c "import site; print(site.getsitepackages()[0])")
  "$venv/bin/python" -c "import site; print(site.getsitepackages()[0])" |
    xargs -I{} sh -c "echo '$site' > {}/gpurun-torch.pth"
  "$venv/bin/pip" install -q --no-deps torchvision==0.26.0
  "$venv/bin/pip" install -q pillow
fi
# The decoders compared on one image first (the choice's measurement: image_decode.cpp).
# libspng is a candidate only, not a dependency of gpurun: installed here for the comparison.
if ! pkg-config --exists spng; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libspng-dev >/dev/null
fi
decode=$(mktemp)
g++ -O2 -o "$decode" scripts/bench/image_decode.cpp $(pkg-config --cflags --libs libturbojpeg libpng spng) -ljpeg
"$decode"
rm -f "$decode"
bench=build/scripts/bench/gpurun_bench_image_folder
data=${GPURUN_BENCH_IMAGES:-${XDG_CACHE_HOME:-$HOME/.cache}/gpurun/bench-images-$count}
if [ ! -f "$data/.complete" ]; then
  rm -rf "$data"
  echo "making $count JPEGs of 400x300 in $data"
  "$bench" make "$data" "$count"
  touch "$data/.complete"
fi
du -sh "$data" | awk '{print "folder: " $1}'
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for threads in 1 2; do
  "$bench" run "$data" "$threads" "$count" 2>/dev/null | tail -1 >>"$out"
done
"$venv/bin/python" - "$data" "$count" "$out" <<'PY'
import json, sys, time
import torch, torchvision
from torchvision import datasets, transforms
data, count, cpp = sys.argv[1], int(sys.argv[2]), [json.loads(l) for l in open(sys.argv[3])]
t = transforms.Compose([
    transforms.RandomResizedCrop(224),
    transforms.RandomHorizontalFlip(),
    transforms.ToTensor(),
    transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
])
ds = datasets.ImageFolder(data, transform=t)
n = min(count, len(ds))
subset = torch.utils.data.Subset(ds, range(n))
print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {n} images")
for workers, c in zip((1, 2), cpp):
    loader = torch.utils.data.DataLoader(subset, batch_size=64, shuffle=True, num_workers=workers)
    start = time.perf_counter()
    seen = 0
    for x, y in loader:
        seen += x.shape[0]
    py = seen / (time.perf_counter() - start)
    print(f"workers {workers}: gpurun {c['samples_per_second']:8.1f} samples/s, "
          f"torchvision {py:8.1f} samples/s, ratio {c['samples_per_second'] / py:.2f} (goal >= 1.0)")
PY

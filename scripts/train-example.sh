#!/usr/bin/env bash
# Installs the dependencies, builds gpurun, and trains the Fashion-MNIST example, resuming
# from runs/fashion_mnist when it was interrupted before. Extra arguments go to gpurun.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh gpurun
exec build/runner/gpurun --resume --ckpt runs/fashion_mnist examples/fashion_mnist.yaml "$@"

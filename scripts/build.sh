#!/usr/bin/env bash
# Configures and builds gpurun into ./build with Ninja, against the LibTorch that
# scripts/install-deps.sh chose (--print-torch-prefix).
# Usage: scripts/build.sh [TARGET...]   (default: everything, tests included)
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=$(scripts/install-deps.sh --print-torch-prefix)
python=$(scripts/install-deps.sh --print-torch-python)
# TensorBoard's reader for the tests ("" without it: those tests fail and say why).
tools_python=$(scripts/install-deps.sh --print-tools-python 2>/dev/null || true)
# Caffe2's CMake probes for a GPU to pick CUDA architectures; gpurun compiles no kernels of its
# own, so name one list and spare the probe (and its warning) on machines without a GPU.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-"8.0;9.0"}
mkdir -p build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPURUN_BUILD_TESTS=ON \
  -DCMAKE_PREFIX_PATH="$prefix" -DGPURUN_PYTHON="$python" -DGPURUN_TOOLS_PYTHON="$tools_python" >build/cmake.log 2>&1 || { mkdir -p build; cat build/cmake.log; exit 1; }
grep -E "^-- gpurun:" build/cmake.log || true
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j"$(nproc)" "${targets[@]}"
# What the binary really loads: libtorch_cuda (CUDA build) and NCCL, or neither (CPU LibTorch).
if [ -x build/runner/gpurun ]; then
  linked=$(ldd build/runner/gpurun | awk '/libtorch_cuda|libnccl|libc10_cuda/ {printf "%s%s", sep, $1; sep=", "}')
  echo "-- gpurun: build/runner/gpurun links ${linked:-no CUDA library} ($(build/runner/gpurun --version))"
fi

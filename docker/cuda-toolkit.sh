#!/usr/bin/env bash
# Completes the CUDA toolkit that PyPI's torch wheel already half brings, so that a CUDA LibTorch
# can be built against without NVIDIA's toolkit or its images: the image's build stage runs it.
#
# The torch 2.11.0 wheel depends on `cuda-toolkit[cublas,cudart,...]==13.0.2`, whose wheels put
# the CUDA runtime's headers and libraries in site-packages/nvidia/cu13/{include,lib}. Caffe2's
# CMake config (torch/share/cmake/Caffe2/public/cuda.cmake) still wants a whole toolkit: FindCUDA
# and enable_language(CUDA) need nvcc, which must compile and link a test program (cicc, ptxas,
# the crt headers), and the libraries by their link names. This script adds, in the same venv:
#   - the same cuda-toolkit release's extras nvcc, crt, nvvm and cccl (read from torch's own
#     requirement, so the compiler matches the runtime the wheel pins: 13.0.88 for 2.11.0);
#   - lib64 -> lib (nvcc.profile links from $TOP/lib64 on x86_64);
#   - libX.so -> libX.so.N for every library that has only its versioned name (libcudart.so,
#     libnvrtc.so: FindCUDA and TorchConfig.cmake look for those).
# gpurun compiles no CUDA code of its own; nvcc is there only for CMake's checks.
#
# Usage: docker/cuda-toolkit.sh install       (after scripts/install-deps.sh; pip in its venv)
#        docker/cuda-toolkit.sh --print-root  print the toolkit root (put ROOT/bin on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/install-deps.sh --print-torch-python)

# The torch wheel's cuda-toolkit requirement ("cuda-toolkit[...]==13.0.2; ...") and the root its
# wheels install into (nvidia/cu13 beside torch/ for CUDA 13).
read -r pin root < <("$py" - <<'EOF'
import importlib.metadata as md, os, re, torch
pin = ""
for req in md.requires("torch") or []:
    m = re.match(r"cuda-toolkit(\[[^\]]*\])?\s*==\s*([0-9.]+)", req)
    if m:
        pin = m.group(2)
site = os.path.dirname(os.path.dirname(torch.__file__))
print(pin or "-", os.path.join(site, "nvidia", "cu" + pin.split(".")[0]) if pin else "-")
EOF
)
if [ "$pin" = - ]; then
  echo "cuda-toolkit.sh: torch $("$py" -c 'import torch; print(torch.__version__)') does not" \
    "depend on PyPI's cuda-toolkit (a CPU wheel, or CUDA 12's per-library wheels): nothing to add" >&2
  exit 1
fi

case "${1:-}" in
  --print-root)
    echo "$root"
    exit 0 ;;
  install) ;;
  *)
    echo "usage: docker/cuda-toolkit.sh install|--print-root" >&2
    exit 2 ;;
esac

echo "cuda-toolkit.sh: adding nvcc, crt, nvvm and cccl of cuda-toolkit $pin to $root"
"$py" -m pip install -q "cuda-toolkit[nvcc,crt,nvvm,cccl]==$pin"
[ -e "$root/lib64" ] || ln -s lib "$root/lib64"
for lib in "$root"/lib/lib*.so.*; do
  link=${lib%%.so.*}.so
  [ -e "$link" ] || ln -s "$(basename "$lib")" "$link"
done
"$root/bin/nvcc" --version | tail -1

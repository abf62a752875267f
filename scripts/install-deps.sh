#!/usr/bin/env bash
# Installs what gpurun needs to build, test and train: Debian packages, and LibTorch from
# PyTorch 2.x, the way GPU users have it.
#
# LibTorch: the PyTorch that `python3` already imports (a rented GPU box, a conda env) when it
# is >= 2.7; otherwise the pinned release below, from PyPI, in a virtual environment outside
# the checkout ($GPURUN_TORCH_VENV), so that every clone on the machine reuses it. PyPI's
# torch 2.11.0 wheel is built for CUDA 13.0 (cuda-toolkit 13.0.2, cuDNN 9.19, NCCL 2.28,
# checked with `pip download --no-deps torch==2.11.0`), the toolkit's major version here, and
# brings its own CUDA libraries (cuSPARSELt, NVSHMEM and cuFile are not in the toolkit).
#
# Usage: scripts/install-deps.sh                       install (idempotent; root or sudo for apt)
#        scripts/install-deps.sh --print-torch-prefix  print the CMake prefix of the LibTorch to
#                                                      build against, and nothing else
#        scripts/install-deps.sh --print-torch-python  print the Python that has that torch
#        scripts/install-deps.sh --print-tools-python  print the Python that has tensorboard
#        scripts/install-deps.sh --print-hf-python     print the Python that has transformers,
#                                                      peft and safetensors (and that torch)
set -euo pipefail

TORCH_PIN=2.11.0     # the one place the PyPI release is named
TENSORBOARD_PIN=2.21.0  # the official reader the tests check RUN_DIR/tensorboard/ with
TORCH_MIN=2.7        # C++11-ABI wheels (Debian's yaml-cpp, spdlog link) and device-generic autocast
GPURUN_TORCH_VENV=${GPURUN_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gpurun/torch-$TORCH_PIN}
# TensorBoard for the tests, in a venv of its own: a user's python3 with torch stays untouched.
GPURUN_TOOLS_VENV=${GPURUN_TOOLS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gpurun/tools-tb$TENSORBOARD_PIN}
# Hugging Face's own code, the reference the tests hold `model: {name: hf}`, the loss mask and
# `gpurun export` to (tests/tools/hf/): it builds the tiny Llama-family models the tests load,
# computes the loss they must agree with, and loads what gpurun exports. Pinned, because the
# files they write (config.json's keys, the safetensors names, adapter_config.json) are what
# the tests compare with.
TRANSFORMERS_PIN=5.25.0
PEFT_PIN=0.21.2
SAFETENSORS_PIN=0.8.0
# In a venv of its own too, which sees torch_python's torch through a .pth file rather than
# installing its own (2 GB again, and maybe another build than the one gpurun links).
GPURUN_HF_VENV=${GPURUN_HF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gpurun/hf-tools-tf$TRANSFORMERS_PIN}

packages=(
  build-essential cmake ninja-build pkg-config git ccache clang-format
  libgloo-dev                       # Gloo's headers, which c10d's ProcessGroupGloo.hpp includes
  libcxxopts-dev libyaml-cpp-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libxxhash-dev
  zlib1g-dev
  libturbojpeg0-dev libpng-dev      # data.name image_folder: JPEG (TurboJPEG) and PNG decoding
  libgtest-dev                      # tests
  python3 python3-venv              # the PyTorch venv, interop tests (torch.load of model.pt)
  dataset-fashion-mnist             # the real data set: /usr/share/datasets/fashion-mnist
  bible-kjv-text bible-kjv          # the King James Bible for examples/char_lm.yaml, kjv_tokens.yaml
  procps util-linux                 # ps/kill/mount used by the fault-injection tests
  libfuse3-dev                      # tests/tools/faultfs, the storage fault tests' FUSE file system
  iproute2 nftables                 # ip netns, nft: the network fault tests' two nodes
  clang                             # tests/fuzz: libFuzzer and the sanitizers (ctest -L fuzz)
  libprotobuf-dev protobuf-compiler # RUN_DIR/tensorboard/: TensorBoard's Event messages
  libjs-chart.js                    # gpurun report: Chart.js, inlined into the page at build time
  chromium                          # tests/browser: the report opened in a real headless browser
  libcurl4-openssl-dev libxml2-dev  # ObjectStorage (S3): HTTP, and the XML of S3's answers
  libssl-dev                        # ObjectStorage (S3): each part's Content-MD5 (libcrypto)
  # scripts/s3-gateway.sh: a real S3 server for the object-storage tests (Ceph's RADOS Gateway on
  # a one-OSD in-memory cluster), curl to ask it; boto3 for the tests that check gpurun's objects
  radosgw ceph-mon ceph-osd ceph-common curl
  slurm-wlm munge                   # scripts/slurm-cluster.sh: a real Slurm 22.05 for the Slurm tests
  python3-boto3 python3-xxhash       # scripts/bench/s3.sh: boto3 checking xxh3 as gpurun does
)
# Debian's LibTorch 1.13 (CPU only, 2022) is no longer supported; its headers in /usr/include
# would shadow the chosen LibTorch's, so it is removed when present.
obsolete=(libtorch-dev libtorch1.13 python3-torch)

# bible-kjv-text ships the text compressed in its own format (/usr/lib/bible.data); its reader
# `bible` writes it as plain text, one verse a line (4.3 MB, ASCII, the same bytes every time).
KJV=/usr/local/share/gpurun/kjv.txt

# Prints the Python that has a usable torch (>= TORCH_MIN), or nothing.
torch_python() {
  local py
  for py in python3 "$GPURUN_TORCH_VENV/bin/python"; do
    command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || continue
    if "$py" - "$TORCH_MIN" >/dev/null 2>&1 <<'EOF'
import sys
import torch
want = tuple(int(x) for x in sys.argv[1].split("."))
have = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if have >= want else 1)
EOF
    then
      echo "$py"
      return
    fi
  done
}

# Whether the Hugging Face venv imports the pinned releases and a torch; its site-packages.
hf_ok() {
  "$GPURUN_HF_VENV/bin/python" - "$TRANSFORMERS_PIN" "$PEFT_PIN" "$SAFETENSORS_PIN" \
    >/dev/null 2>&1 <<'EOF'
import sys
import peft, safetensors, torch, transformers
have = (transformers.__version__, peft.__version__, safetensors.__version__)
sys.exit(0 if have == tuple(sys.argv[1:]) else 1)
EOF
}
hf_site() {
  "$GPURUN_HF_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null
}

case "${1:-}" in
  --print-tools-python)
    if ! "$GPURUN_TOOLS_VENV/bin/python" -c 'import tensorboard' 2>/dev/null; then
      echo "install-deps: no tensorboard in $GPURUN_TOOLS_VENV; run scripts/install-deps.sh" >&2
      exit 1
    fi
    echo "$GPURUN_TOOLS_VENV/bin/python"
    exit 0 ;;
  --print-hf-python)
    if ! hf_ok; then
      echo "install-deps: no transformers $TRANSFORMERS_PIN, peft $PEFT_PIN, safetensors $SAFETENSORS_PIN and torch in $GPURUN_HF_VENV; run scripts/install-deps.sh" >&2
      exit 1
    fi
    echo "$GPURUN_HF_VENV/bin/python"
    exit 0 ;;
  --print-torch-prefix|--print-torch-python)
    py=$(torch_python)
    if [ -z "$py" ]; then
      echo "install-deps: no PyTorch >= $TORCH_MIN found; run scripts/install-deps.sh" >&2
      exit 1
    fi
    [ "$1" = --print-torch-python ] && exec "$py" -c 'import sys; print(sys.executable)'
    exec "$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' ;;
esac

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

remove=()
for p in "${obsolete[@]}"; do installed "$p" && remove+=("$p"); done
if [ ${#remove[@]} -gt 0 ]; then
  echo "install-deps: removing Debian's LibTorch 1.13 (${remove[*]}): gpurun builds on PyTorch's"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get purge -y -qq "${remove[@]}" >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get autoremove -y -qq >/dev/null
fi

missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages already installed"
else
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# libFuzzer's runtime (tests/fuzz) is only a Recommends of clang, which --no-install-recommends
# leaves out; its package carries clang's major version (Debian 12: 14, Ubuntu 24.04: 18).
clang_major=$(clang --version 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
if [ -n "$clang_major" ] && ! installed "libclang-rt-$clang_major-dev"; then
  echo "install-deps: installing libclang-rt-$clang_major-dev (libFuzzer, for ctest -L fuzz)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "libclang-rt-$clang_major-dev" ||
    echo "install-deps: no libclang-rt-$clang_major-dev: the fuzz tests will be skipped"
fi
if [ ! -s "$KJV" ]; then
  echo "install-deps: writing $KJV"
  $SUDO mkdir -p "$(dirname "$KJV")"
  bible -l100000 Gen1:1-Rev22:21 </dev/null | $SUDO tee "$KJV.tmp" >/dev/null
  $SUDO mv "$KJV.tmp" "$KJV"
fi
# examples/kjv_tokens.yaml: the same text as uint16 token files, one token per byte, the first
# 90% as train.bin and the rest as val.bin beside it (nanoGPT's layout).
KJV_TOKENS=/usr/local/share/gpurun/kjv-tokens
if [ ! -s "$KJV_TOKENS/val.bin" ]; then
  echo "install-deps: writing $KJV_TOKENS/{train,val}.bin"
  $SUDO mkdir -p "$KJV_TOKENS"
  $SUDO python3 - "$KJV" "$KJV_TOKENS" <<'PY'
import array, os, sys
text = open(sys.argv[1], "rb").read()
split = len(text) * 9 // 10
for name, part in (("train.bin", text[:split]), ("val.bin", text[split:])):
    with open(os.path.join(sys.argv[2], name + ".tmp"), "wb") as f:
        array.array("H", list(part)).tofile(f)  # little-endian on every machine gpurun runs on
    os.replace(os.path.join(sys.argv[2], name + ".tmp"), os.path.join(sys.argv[2], name))
PY
fi

py=$(torch_python)
if [ -z "$py" ]; then
  echo "install-deps: installing PyTorch $TORCH_PIN from PyPI into $GPURUN_TORCH_VENV"
  # An interrupted install leaves a torch that does not import: the next run installs again.
  python3 -m venv "$GPURUN_TORCH_VENV"
  # numpy: torch's tensor <-> numpy interop in the Python tests and benchmarks.
  "$GPURUN_TORCH_VENV/bin/pip" install -q "torch==$TORCH_PIN" numpy
  py=$(torch_python)
fi
"$py" -c 'import torch; print("install-deps: LibTorch", torch.__version__, "from", torch.__file__.rsplit("/", 2)[0], "(CUDA", torch.version.cuda or "none", end=")\n")'
if ! "$GPURUN_TOOLS_VENV/bin/python" -c 'import tensorboard' 2>/dev/null; then
  echo "install-deps: installing tensorboard $TENSORBOARD_PIN from PyPI into $GPURUN_TOOLS_VENV"
  python3 -m venv "$GPURUN_TOOLS_VENV"
  "$GPURUN_TOOLS_VENV/bin/pip" install -q "tensorboard==$TENSORBOARD_PIN"
fi
# The Hugging Face tools: a venv made by torch's own Python (the .pth below only works for the
# Python version torch's compiled modules were built for; run from a venv, `-m venv` makes one
# on the same base interpreter), whose site-packages gets a .pth naming the directory torch is
# in. Python then imports torch from there, and pip sees it installed and leaves it be; what else
# transformers and peft need goes into this venv, ahead of that directory on sys.path. The .pth
# is written again on every run, so that it follows torch_python when that changes; a venv that
# then imports something wrong or not at all (another Python version, an interrupted install, a
# changed pin) is made again.
torch_dir=$("$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
if site=$(hf_site) && [ -d "$site" ]; then echo "$torch_dir" >"$site/gpurun-torch.pth"; fi
if ! hf_ok; then
  echo "install-deps: installing transformers $TRANSFORMERS_PIN, peft $PEFT_PIN and safetensors" \
       "$SAFETENSORS_PIN from PyPI into $GPURUN_HF_VENV (torch from $torch_dir)"
  "$py" -m venv --clear "$GPURUN_HF_VENV"
  echo "$torch_dir" >"$(hf_site)/gpurun-torch.pth"
  "$GPURUN_HF_VENV/bin/pip" install -q "transformers==$TRANSFORMERS_PIN" "peft==$PEFT_PIN" \
    "safetensors==$SAFETENSORS_PIN"
  hf_ok || { echo "install-deps: $GPURUN_HF_VENV still does not import them" >&2; exit 1; }
fi

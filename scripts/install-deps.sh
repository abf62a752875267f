#!/usr/bin/env bash
# Installs what gpurun needs to build, test and train, from Debian's packages only.
# Idempotent: packages already installed are skipped by apt. Run as root (or through sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ccache clang-format
  libtorch-dev libgloo-dev          # LibTorch 1.13 (CPU) and the Gloo headers c10d needs
  libcxxopts-dev libyaml-cpp-dev nlohmann-json3-dev libspdlog-dev libxxhash-dev zlib1g-dev
  libgtest-dev                      # tests
  python3 python3-torch             # interop tests (torch.load of model.pt) and the benchmark
  dataset-fashion-mnist             # the real data set: /usr/share/datasets/fashion-mnist
  bible-kjv-text bible-kjv          # the King James Bible for examples/char_lm.yaml (see below)
  procps util-linux                 # ps/kill/mount used by the fault-injection tests
)

# bible-kjv-text ships the text compressed in its own format (/usr/lib/bible.data); its reader
# `bible` writes it as plain text, one verse a line (4.3 MB, ASCII, the same bytes every time).
KJV=/usr/local/share/gpurun/kjv.txt

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
else
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ! -s "$KJV" ]; then
  echo "install-deps: writing $KJV"
  $SUDO mkdir -p "$(dirname "$KJV")"
  bible -l100000 Gen1:1-Rev22:21 </dev/null | $SUDO tee "$KJV.tmp" >/dev/null
  $SUDO mv "$KJV.tmp" "$KJV"
fi

#!/usr/bin/env bash
# Installs what gpurun needs to build, test and train, from Debian's packages only.
# Idempotent: packages already installed are skipped by apt. Run as root (or through sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ccache
  libtorch-dev libgloo-dev          # LibTorch 1.13 (CPU) and the Gloo headers c10d needs
  libcxxopts-dev libyaml-cpp-dev nlohmann-json3-dev libspdlog-dev libxxhash-dev zlib1g-dev
  libgtest-dev                      # tests
  python3 python3-torch             # interop tests (torch.load of model.pt) and the benchmark
  dataset-fashion-mnist             # the real data set: /usr/share/datasets/fashion-mnist
  procps util-linux                 # ps/kill/mount used by the fault-injection tests
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

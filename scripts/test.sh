#!/usr/bin/env bash
# Installs the dependencies, builds gpurun with its tests, and runs every test with ctest.
# Usage: scripts/test.sh [ctest arguments, e.g. -L unit]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd build
ctest --output-on-failure --timeout 600 -j2 "$@"

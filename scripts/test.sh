#!/usr/bin/env bash
# Installs the dependencies, builds gpurun with its tests, and runs every test with ctest.
# Usage: scripts/test.sh [ctest arguments, e.g. -L unit]; the `docker` label only when named
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd build
# The `docker` label (scripts/docker-check.sh: an image build and containerised runs, an hour or
# more) runs only when asked for: scripts/test.sh -L docker.
exclude=(-LE docker)
case " $* " in *docker*) exclude=() ;; esac
ctest --output-on-failure --timeout 600 -j2 "${exclude[@]}" "$@"

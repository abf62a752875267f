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
# The unit tests once more without any capability, as in a container or for a user without
# the right to mount or make namespaces: a test that needs a right it lacks skips and says why.
# (Not the tests of the S3 client against the gateway: they need no right, and ran above.)
if [ "$(id -u)" = 0 ] && [ $# -eq 0 ] && command -v setpriv >/dev/null; then
  echo "== the unit tests without capabilities (setpriv --bounding-set=-all)"
  setpriv --bounding-set=-all --inh-caps=-all -- \
    ctest --output-on-failure --timeout 600 -j2 -L unit -E '^S3(Server|Gateway)'
fi

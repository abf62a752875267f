#!/usr/bin/env bash
# Install round trip: cmake --install BUILD_DIR into a prefix, configure and build the
# out-of-tree example plugin against it with find_package(gpurun), and train it for a few steps
# with the installed gpurun. Usage: install_roundtrip.sh BUILD_DIR EXAMPLE_DIR WORK_DIR
set -euo pipefail
build=$1 example=$2 work=$3
prefix=$work/prefix
rm -rf "$work"
mkdir -p "$work"

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
test -x "$prefix/bin/gpurun"
ls "$prefix"/lib*/cmake/gpurun/gpurunConfig.cmake >/dev/null
test -f "$prefix/include/gpurun/plugin.h"

# The example finds gpurun (and through it LibTorch) from the prefix alone; ccache when present.
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$example" -B "$work/example" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" >"$work/configure.log"
cmake --build "$work/example" >"$work/build.log"
plugin=$(ls "$work"/example/libtiny_mlp.so)

# The installed binary finds its libgpurun_core.so through its RPATH, not the build tree's.
if ldd "$prefix/bin/gpurun" | grep -q "$build/runner/"; then
  echo "installed gpurun links into the build tree:"; ldd "$prefix/bin/gpurun"; exit 1
fi

"$prefix/bin/gpurun" "$example/run.yaml" --ckpt "$work/ckpt" \
  --set model.plugin="$plugin" --set data.train_samples=640 --set data.eval_samples=200 \
  --set train.epochs=1 --set train.threads=1 --set memory.probe_steps=1 2>"$work/train.err" || {
  cat "$work/train.err"; exit 1; }
"$prefix/bin/gpurun" ckpt inspect "$work/ckpt" --json >"$work/manifest.json"
python3 - "$work/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
source = m["extra"]["model_source"]
assert source["kind"] == "plugin" and source["path"].endswith("libtiny_mlp.so"), source
assert m["config"]["model"]["name"] == "tiny_mlp", m["config"]["model"]
assert m["global_step"] == 10, m["global_step"]
print("trained tiny_mlp from the installed package:", m["global_step"], "steps, digest", m["model_digest"])
PY
grep "epoch 1/1" "$work/train.err"

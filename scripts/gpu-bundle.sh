#!/usr/bin/env bash
# Fills bundle/ (ignored by git, at most 60 MiB) with everything scripts/gpu-check.sh needs to
# build and test gpurun on a GPU machine that has CUDA PyTorch, a compiler, CMake and ninja but
# no apt and no network: the Debian -dev packages gpurun builds against, their runtime
# libraries, and the Fashion-MNIST files. Run it on a development machine (Debian 12, after
# scripts/install-deps.sh); carry bundle/ to the GPU machine with the checkout.
#
#   bundle/debs/*.deb          the packages as apt-get download fetched them
#   bundle/sysroot/usr/...     the same, unpacked: headers, libraries, CMake configs, data
#   bundle/MANIFEST            package versions and sizes
#
# Every dependency gpurun adds joins the list below, or the GPU check cannot build.
#
# The tests' Python tools (install-deps.sh's TensorBoard and Hugging Face venvs) are not
# bundled: gpu-check.sh runs no test that uses them, and their wheels would not fit beside the
# packages under the limit (transformers 5.25.0, peft 0.21.2, safetensors 0.8.0 and what they
# pull beyond torch: 33 MiB, 49 with numpy; and several are built for one Python version, which
# need not be the GPU machine's).
set -euo pipefail
cd "$(dirname "$0")/.."

# -dev packages and the runtime libraries they link (Debian 12 names); header-only ones have none.
packages=(
  libyaml-cpp-dev libyaml-cpp0.7
  libspdlog-dev libspdlog1.10
  libfmt-dev libfmt9
  libcxxopts-dev nlohmann-json3-dev
  libxxhash-dev libxxhash0
  zlib1g-dev zlib1g               # zlib1g: libz.so.1, which the -dev symlink points to
  libturbojpeg0-dev libturbojpeg0    # data.name image_folder: JPEG through TurboJPEG
  libpng-dev libpng16-16             # data.name image_folder: PNG
  libgtest-dev
  libfuse3-dev libfuse3-3            # tests/tools/faultfs (the storage fault tests)
  libgloo-dev                        # headers only: c10d's ProcessGroupGloo.hpp includes them
  dataset-fashion-mnist              # /usr/share/datasets/fashion-mnist/*.gz
  # RUN_DIR/tensorboard/: protoc (and the libraries it runs with) compiles TensorBoard's Event
  # message at build time; gpurun links libprotobuf-lite.
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32
  libjs-chart.js                     # gpurun report: Chart.js, compiled into the page
  # ObjectStorage (S3): HTTP through libcurl, S3's XML answers through libxml2, SigV4's SHA-256
  # and HMAC from OpenSSL's libcrypto. Not bundled, so needed on the GPU machine under the same
  # sonames: what libcurl4 links (libnghttp2.so.14, libidn2.so.0, librtmp.so.1, libssh2.so.1,
  # libpsl.so.5, libgssapi_krb5.so.2, libldap-2.5.so.0, liblber-2.5.so.0, libzstd.so.1,
  # libbrotlidec.so.1) and libxml2's ICU (libicuuc.so.72, 36 MiB) and liblzma.so.5.
  libcurl4-openssl-dev libcurl4
  libxml2-dev libxml2
  libssl-dev libssl3
  # Not bundled: slurm-wlm and munge (scripts/slurm-cluster.sh) and Ceph (scripts/s3-gateway.sh)
  # are servers for the tests on this machine, which gpurun neither builds nor links against;
  # scripts/gpu-check.sh runs no Slurm or S3 test.
)
LIMIT_BYTES=$((60 * 1024 * 1024))

out=bundle
rm -rf "$out.tmp"
mkdir -p "$out.tmp/debs" "$out.tmp/sysroot"
(cd "$out.tmp/debs" && apt-get download "${packages[@]}" >/dev/null 2>&1)
for deb in "$out.tmp"/debs/*.deb; do
  dpkg-deb -x "$deb" "$out.tmp/sysroot"
  dpkg-deb -f "$deb" Package Version Installed-Size | tr '\n' ' ' >>"$out.tmp/MANIFEST"
  echo >>"$out.tmp/MANIFEST"
done
# Some -dev symlinks are absolute (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13): point them
# into the sysroot, where the same package set holds their target, not at the GPU machine's /.
find "$out.tmp/sysroot" -type l | while read -r link; do
  target=$(readlink "$link")
  case "$target" in
    /*) [ -e "$out.tmp/sysroot$target" ] &&
          ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$out.tmp/sysroot$target")" "$link" ;;
  esac
done
# Documentation is not needed to build; the .debs keep it for whoever wants it. Nor are the
# static libraries of protobuf (9 MiB), curl, libxml2 and OpenSSL (15 MiB): gpurun links the
# shared ones. Nor OpenSSL's engines and legacy provider: SHA-256 and HMAC are in its default
# provider, built into libcrypto.
rm -rf "$out.tmp/sysroot/usr/share/doc" "$out.tmp/sysroot/usr/share/man" \
       "$out.tmp/sysroot/usr/share/lintian" "$out.tmp"/sysroot/usr/lib/*/libprotobuf*.a \
       "$out.tmp"/sysroot/usr/lib/*/libprotoc.a "$out.tmp"/sysroot/usr/lib/*/libcurl.a \
       "$out.tmp"/sysroot/usr/lib/*/libxml2.a "$out.tmp"/sysroot/usr/lib/*/libssl.a \
       "$out.tmp"/sysroot/usr/lib/*/libcrypto.a "$out.tmp"/sysroot/usr/lib/*/engines-3 \
       "$out.tmp"/sysroot/usr/lib/*/ossl-modules
# The .debs themselves are only a record: drop them when the unpacked tree alone is too big.
size=$(du -sb "$out.tmp" | cut -f1)
if [ "$size" -gt "$LIMIT_BYTES" ]; then
  rm -rf "$out.tmp/debs"
  size=$(du -sb "$out.tmp" | cut -f1)
fi
if [ "$size" -gt "$LIMIT_BYTES" ]; then
  echo "gpu-bundle: $out is $((size / 1048576)) MiB, over the 60 MiB limit" >&2
  exit 1
fi
rm -rf "$out"
mv "$out.tmp" "$out"
echo "gpu-bundle: $out/ holds ${#packages[@]} packages, $((size / 1048576)) MiB"

#!/usr/bin/env bash
# Builds the image of docker/Dockerfile with podman on this machine and shows, with containers,
# what a user on a rented box or a Slurm site sees: the example trained as the image's non-root
# user on a host folder, a reclaim (a container SIGKILLed mid-epoch, a new one resuming on the
# same folder), a polite stop (`podman stop`: saved, exit 75, resumed), and the unit tests in the
# image. Every resumed run must end with the uninterrupted containerised run's model_digest.
# Prints each step's result and time; exits non-zero on any failure (77: skipped, --if-podman).
#
#   1  install and build   podman, runc, mmdebstrap when missing; the base image (debian:12, or
#                          made by mmdebstrap when it cannot be pulled); the build, its time, the
#                          sizes of the final image and of the build stage; what the image holds
#   2  the example         the README's command in a container, --ckpt a host folder
#   3  a reclaim           `podman kill -s KILL` mid-epoch; a new container resumes to the digest
#   4  a polite stop       `podman stop -t 30`: exit 75 inside the grace; a new container resumes
#   5  unit tests          `ctest -L unit` in the image of the build tree (target `test`)
#   6  nothing of here     no pip configuration, no machine certificate in the images
#
# Usage: scripts/docker-check.sh [--if-podman] [--dir DIR]
#   --if-podman  exit 77 (skipped) with a message when podman is not installed (the ctest `docker`)
#   --dir DIR    where the logs and the runs' checkpoint folders go (default
#                /var/tmp/gpurun-docker-check; emptied at the start, kept at the end)
# The build's compiler cache is the Dockerfile's cache mount, which buildah keeps in
# /var/tmp/buildah-cache/var/cache/gpurun-ccache: remove that folder for a cold build.
#
# Written for this project's development machines (Debian 12, root, hybrid cgroups, no image
# registry): the runtime is runc (crun refuses hybrid cgroups), podman's default ulimits are
# dropped through a containers.conf of this script's own (CONTAINERS_CONF: the runtimes may not
# raise RLIMIT_NOFILE here), and the build runs with --network host. When this machine's pip has
# a configuration (`pip config list`), it and the CA bundle it names are given to the build as
# secrets, which the one step that runs pip mounts read-only under /run/pip-build/ for that step
# alone; neither enters an image (step 6 checks).
set -euo pipefail
cd "$(dirname "$0")/.."

if_podman=0
dir=/var/tmp/gpurun-docker-check
while [ $# -gt 0 ]; do
  case $1 in
    --if-podman) if_podman=1 ;;
    --dir) dir=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d;s/^# \{0,1\}//'; exit 0 ;;
    *) echo "docker-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ $if_podman = 1 ] && ! command -v podman >/dev/null 2>&1; then
  echo "docker-check: skipped: podman is not installed (scripts/docker-check.sh installs it and runs)"
  exit 77
fi

IMAGE=localhost/gpurun
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rm -rf "${dir:?}"/{logs,ckpt,conf}
mkdir -p "$dir"/{logs,ckpt,conf}

# --- reporting: each step prints its result and its time; the summary repeats them --------------
started=$(date +%s)
step_no="" step_name="" step_started=0 summary=()
step() {
  step_no=$1 step_name=$2 step_started=$(date +%s)
  echo
  echo "=== step $step_no: $step_name ($(date -u +%H:%M:%S) UTC)"
}
pass() {
  local secs=$(($(date +%s) - step_started))
  echo "=== step $step_no: PASS in ${secs} s${1:+: $1}"
  summary+=("$(printf '  %s  %-22s PASS %6d s  %s' "$step_no" "$step_name" "$secs" "${1:-}")")
  step_no=""
}
fail() {
  echo "=== step $step_no: FAIL after $(($(date +%s) - step_started)) s: $*" >&2
  exit 1
}
on_exit() {
  local rc=$?
  # Containers this script started; the images stay (gpurun, gpurun:build, gpurun:test).
  for c in "${containers[@]}"; do pm rm -f "$c" >/dev/null 2>&1 || true; done
  [ $rc -eq 77 ] && return
  echo
  echo "docker-check: summary ($(($(date +%s) - started)) s in all; logs and runs in $dir)"
  printf '%s\n' "${summary[@]}"
  if [ -n "$step_no" ]; then
    echo "  $step_no  $step_name  FAIL (exit $rc)"
  fi
  [ $rc -eq 0 ] && echo "docker-check: all steps passed" || echo "docker-check: FAILED"
}
containers=()
trap on_exit EXIT
trap 'echo "docker-check: line $LINENO failed: $BASH_COMMAND" >&2' ERR

# podman with this machine's runtime and ulimits (see the header).
cat >"$dir/conf/containers.conf" <<'EOF'
[containers]
default_ulimits = []
EOF
export CONTAINERS_CONF=$dir/conf/containers.conf
pm() { podman --runtime runc "$@"; }

human() { awk -v b="$1" 'BEGIN { printf "%.2f GiB", b / 1073741824 }'; }

# The newest complete checkpoint of a --ckpt folder (LATEST), and a checkpoint's model_digest.
latest() { cat "$1/LATEST" 2>/dev/null || true; }
digest_of() {
  sed -n 's/.*"model_digest" *: *"\([0-9a-f]*\)".*/\1/p' "$1/$(latest "$1")/manifest.json" | head -1
}
# The global step of the last `step` event in a run's metrics.jsonl (0 before the first).
last_step() {
  grep '"event":"step"' "$1/metrics.jsonl" 2>/dev/null | tail -1 |
    sed -n 's/.*"global_step":\([0-9]*\).*/\1/p' | grep . || echo 0
}
# A checkpoint folder's global step (ckpt-e0001-s0000938 -> 938).
step_of() { local s=${1##*-s}; echo $((10#${s:-0})); }

# Waits until the run in folder $1 (container $2) is mid-epoch after a checkpoint: LATEST names a
# checkpoint of epoch >= 1 and a step event at least 100 steps past it is logged. The run's own
# events, never a fixed time: a loaded machine is slower, a GPU faster.
wait_mid_epoch() {
  local folder=$1 name=$2 name_latest s
  for ((i = 0; i < 3600; i++)); do
    name_latest=$(latest "$folder")
    if [ -n "$name_latest" ] && [ "$(step_of "$name_latest")" -gt 0 ]; then
      s=$(last_step "$folder")
      if [ "$s" -ge $(($(step_of "$name_latest") + 100)) ]; then
        echo "running: newest checkpoint $name_latest, step $s logged"
        return 0
      fi
    fi
    [ "$(pm inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ] ||
      fail "container $name ended before mid-epoch (exit $(pm inspect -f '{{.State.ExitCode}}' "$name"))"
    sleep 1
  done
  fail "no step 100 past a checkpoint in an hour in $folder"
}

# A host folder for --ckpt, writable by the image's user (uid 1000 by default).
ckpt_folder() {
  mkdir -p "$dir/ckpt/$1"
  chown "$image_user" "$dir/ckpt/$1"
  echo "$dir/ckpt/$1"
}
example=(--resume --ckpt /ckpt examples/fashion_mnist.yaml)  # the README's command

# --- 1: install and build -----------------------------------------------------------------------
step 1 "install and build"
need=()
for tool in podman runc mmdebstrap; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  t=$(date +%s)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${need[@]}" >"$dir/logs/apt.log" 2>&1 || { tail -20 "$dir/logs/apt.log"; fail "apt-get install"; }
  echo "installed ${need[*]} in $(($(date +%s) - t)) s"
fi
echo "$(podman --version), $(runc --version | head -1), mmdebstrap $(mmdebstrap --version | awk '{print $2}')"

base=""
for ref in docker.io/library/debian:12 localhost/debian:12; do
  if pm image exists "$ref"; then base=$ref; break; fi
done
if [ -z "$base" ]; then
  t=$(date +%s)
  if timeout 120 podman --runtime runc pull -q docker.io/library/debian:12 >"$dir/logs/pull.log" 2>&1; then
    base=docker.io/library/debian:12
  else
    echo "debian:12 cannot be pulled ($(tail -1 "$dir/logs/pull.log" | cut -c1-160))"
    echo "making localhost/debian:12 with mmdebstrap (minbase, bookworm, deb.debian.org)"
    $SUDO mmdebstrap --variant=minbase bookworm "$dir/conf/rootfs.tar" </dev/null \
      >"$dir/logs/mmdebstrap.log" 2>&1 || { tail -20 "$dir/logs/mmdebstrap.log"; fail "mmdebstrap"; }
    pm import -q "$dir/conf/rootfs.tar" localhost/debian:12 >/dev/null
    rm -f "$dir/conf/rootfs.tar"
    base=localhost/debian:12
  fi
  echo "base image $base ready in $(($(date +%s) - t)) s"
else
  echo "base image $base (already here)"
fi

# This machine's pip configuration, for the build alone: `pip config list` as one file of our own
# (every entry but the certificate), and the CA bundle it names, as the build's secrets.
secrets=()
if python3 -m pip config list >"$dir/conf/pip-config.txt" 2>/dev/null && [ -s "$dir/conf/pip-config.txt" ]; then
  cert=$(python3 - "$dir/conf/pip-config.txt" "$dir/conf/pip.conf" <<'EOF'
import re, sys
sections, certs = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r"^([^=]+)\.([^.=]+)='(.*)'$", line.rstrip("\n"))
    if not m:
        continue
    section, key, value = m.groups()
    if key == "cert":  # given as PIP_CERT, the bundle mounted at its own path
        certs[section] = value
        continue
    sections.setdefault("global" if section == ":env:" else section, {})[key] = value
# pip's precedence: the environment, then [global]'s, then a command's section.
cert = certs.get(":env:") or certs.get("global") or next(iter(certs.values()), "")
with open(sys.argv[2], "w") as f:
    for section, keys in sections.items():
        f.write("[%s]\n" % section)
        for key, value in keys.items():
            f.write("%s = %s\n" % (key, value))
print(cert)
EOF
)
  secrets+=(--secret "id=pip_conf,src=$dir/conf/pip.conf")
  if [ -n "$cert" ] && [ -f "$cert" ]; then
    secrets+=(--secret "id=pip_cert,src=$(readlink -f "$cert")")
  fi
  echo "pip: this machine's configuration$([ -n "$cert" ] && echo " and CA bundle ($cert)") given to the build as secrets"
fi
cache=/var/tmp/buildah-cache/var/cache/gpurun-ccache
echo "compiler cache: $([ -d "$cache" ] && du -sh "$cache" | cut -f1 || echo none) in $cache"

build() {  # build TARGET TAG: podman build, the full output in logs/build-TARGET.log
  local target=$1 tag=$2 t rc=0
  t=$(date +%s)
  pm build --network host -f docker/Dockerfile --build-arg BASE="$base" "${secrets[@]}" \
    ${target:+--target "$target"} -t "$tag" . >"$dir/logs/build-${target:-runtime}.log" 2>&1 || rc=$?
  # The stages' steps, the dependency and CMake summaries, gpurun's own check of what it links.
  local log=$dir/logs/build-${target:-runtime}.log
  grep -E '^(\[[0-9]+/[0-9]+\] )?STEP [0-9]|^(install-deps:|cuda-toolkit.sh:|-- gpurun:|Cuda compilation|gpurun [0-9])' \
    "$log" | cut -c1-160 || true
  echo "($(grep -c '^--> Using cache' "$log" || true) steps taken from podman's layer cache)"
  if [ $rc -ne 0 ]; then
    tail -40 "$log"
    fail "podman build ${target:+--target $target} (exit $rc; $log)"
  fi
  echo "built $tag in $(($(date +%s) - t)) s"
}
t_build=$(date +%s)
build test "$IMAGE:test"       # the build stage and its ctest entrypoint
build build "$IMAGE:build"     # the build stage itself (cached), to weigh it
build "" "$IMAGE:latest"       # the runtime stage
build_secs=$(($(date +%s) - t_build))

size_final=$(pm image inspect -f '{{.Size}}' "$IMAGE:latest")
size_build=$(pm image inspect -f '{{.Size}}' "$IMAGE:build")
echo "image $IMAGE:latest: $(human "$size_final"); build stage $IMAGE:build: $(human "$size_build")" \
  "(final = $((100 * size_final / size_build))% of the build stage)"

version=$(pm run --rm --network none "$IMAGE" --version)
echo "in the image: $version"
case $version in *"CUDA yes"*) ;; *) fail "gpurun --version in the image does not say CUDA yes" ;; esac
image_user=$(pm image inspect -f '{{.Config.User}}' "$IMAGE")
uid=$(pm run --rm --network none --entrypoint id "$IMAGE" -u)
[ "$uid" != 0 ] || fail "the image runs as root"
echo "user $image_user (uid $uid); entrypoint $(pm image inspect -f '{{.Config.Entrypoint}}' "$IMAGE")"
found=$(pm run --rm --network none --entrypoint /bin/sh "$IMAGE" -c \
  'for c in cc c++ gcc g++ clang clang++ nvcc cmake ctest ninja make ld python3; do command -v $c; done
   ls -d /src /opt/torch/bin /opt/tools 2>/dev/null
   find / -xdev -name "gpurun_*tests" 2>/dev/null | head -5
   find /opt /usr/local \( -name "*.a" -o -name "*.h" -o -name "*.cuh" -o -name "*.py" \) 2>/dev/null | head -5' || true)
[ -z "$found" ] || fail "the final image holds build or test files: $found"
echo "no compiler, build tool, Python, test, nor any header or static library under /opt and /usr/local in $IMAGE:latest"
pass "build ${build_secs} s; final $(human "$size_final") vs build stage $(human "$size_build")"

# --- 2: the README's command in a container, as the image's user, on a host folder --------------
step 2 "the example"
run_a=$(ckpt_folder example)
containers+=(gpurun-check-example)
pm run --rm --network none --name gpurun-check-example -v "$run_a:/ckpt" "$IMAGE" "${example[@]}" \
  >"$dir/logs/example.log" 2>&1 || { tail -30 "$dir/logs/example.log"; fail "the example exited $?"; }
grep -v '^  ' "$dir/logs/example.log" | sed 's/^/  | /'  # gpurun's output, less the resolved config
grep -E '"event":"epoch"' "$run_a/metrics.jsonl" |
  sed -n 's/.*"epoch":\([0-9]*\).*"eval_accuracy":\([0-9.]*\).*/epoch \1: eval accuracy \2/p' || true
reference=$(digest_of "$run_a")
[ -n "$reference" ] || fail "no model_digest in $run_a/$(latest "$run_a")"
owner=$(stat -c %u:%g "$run_a/$(latest "$run_a")/manifest.json")
echo "final checkpoint $(latest "$run_a"), written by $owner on the host; model_digest $reference"
[ "${owner%%:*}" != 0 ] || fail "the checkpoint was written by root"
pass "uninterrupted digest $reference"

# Runs the example in a new container on folder $1 until it ends; the exit code must be 0 and
# the run must have resumed from checkpoint $2.
resume_to_the_end() {
  local folder=$1 from=$2 name=$3 resumed
  containers+=("$name")
  pm run --rm --network none --name "$name" -v "$folder:/ckpt" "$IMAGE" "${example[@]}" \
    >"$dir/logs/$name.log" 2>&1 || { tail -30 "$dir/logs/$name.log"; fail "the resumed run exited $?"; }
  grep -v '^  ' "$dir/logs/$name.log" | grep -iE 'lease|resum|finished' | sed 's/^/  | /'
  resumed=$(grep '"event":"resume"' "$folder/metrics.jsonl" | tail -1 |
    sed -n 's/.*"path":"\([^"]*\)".*/\1/p')
  echo "new container $name resumed from ${resumed##*/} and finished: $(latest "$folder")"
  [ "${resumed##*/}" = "$from" ] || fail "it resumed from ${resumed:-nothing}, not from $from"
}

# --- 3: a reclaim: SIGKILL mid-epoch, a new container on the same folder -------------------------
step 3 "a reclaim"
run_b=$(ckpt_folder reclaim)
containers+=(gpurun-check-reclaimed)
pm run -d --network none --name gpurun-check-reclaimed -v "$run_b:/ckpt" "$IMAGE" "${example[@]}" >/dev/null
wait_mid_epoch "$run_b" gpurun-check-reclaimed
pm kill -s KILL gpurun-check-reclaimed >/dev/null
code=$(pm wait gpurun-check-reclaimed)
pm logs gpurun-check-reclaimed >"$dir/logs/gpurun-check-reclaimed.log" 2>&1 || true
killed_at=$(last_step "$run_b")
newest=$(latest "$run_b")
echo "podman kill -s KILL: container exit $code at step $killed_at; newest checkpoint $newest"
[ "$code" = 137 ] || fail "the killed container exited $code, not 137 (SIGKILL)"
resume_to_the_end "$run_b" "$newest" gpurun-check-after-reclaim
digest=$(digest_of "$run_b")
echo "model_digest $digest (uninterrupted $reference)"
[ "$digest" = "$reference" ] || fail "the reclaimed run's digest differs"
pass "killed at step $killed_at, resumed from $newest, digest $digest = uninterrupted"

# --- 4: a polite stop: podman stop -t 30, exit 75 inside the grace, a new container --------------
step 4 "a polite stop"
run_c=$(ckpt_folder stop)
containers+=(gpurun-check-stopped)
pm run -d --network none --name gpurun-check-stopped -v "$run_c:/ckpt" "$IMAGE" "${example[@]}" >/dev/null
wait_mid_epoch "$run_c" gpurun-check-stopped
before=$(latest "$run_c")
t=$(date +%s%N)
pm stop -t 30 gpurun-check-stopped >/dev/null
stop_ms=$((($(date +%s%N) - t) / 1000000))
code=$(pm inspect -f '{{.State.ExitCode}}' gpurun-check-stopped)
pm logs gpurun-check-stopped >"$dir/logs/gpurun-check-stopped.log" 2>&1 || true
tail -4 "$dir/logs/gpurun-check-stopped.log" | sed 's/^/  | /'
saved=$(latest "$run_c")
signal=$(grep '"event":"signal"' "$run_c/metrics.jsonl" | tail -1 || true)
echo "podman stop -t 30: exit $code after $stop_ms ms; checkpoint before the stop $before, after $saved"
echo "signal event: ${signal:-none}"
[ "$code" = 75 ] || fail "the stopped container exited $code, not 75"
[ $stop_ms -lt 30000 ] || fail "the stop took $stop_ms ms, past the 30 s grace"
[ "$saved" != "$before" ] || fail "no checkpoint was saved on the stop"
resume_to_the_end "$run_c" "$saved" gpurun-check-after-stop
digest=$(digest_of "$run_c")
echo "model_digest $digest (uninterrupted $reference)"
[ "$digest" = "$reference" ] || fail "the stopped run's digest differs"
pass "exit 75 in $stop_ms ms, saved $saved, digest $digest = uninterrupted"

# --- 5: the unit tests in the image --------------------------------------------------------------
step 5 "unit tests"
containers+=(gpurun-check-unit)
rc=0
pm run --rm --network none --name gpurun-check-unit "$IMAGE:test" -L unit -j"$(nproc)" \
  >"$dir/logs/unit.log" 2>&1 || rc=$?
grep -E "tests passed|tests failed|Total Test time|\*\*\*[A-Z]|\((Failed|Timeout|Not Run)\)" "$dir/logs/unit.log" || true
[ $rc -eq 0 ] || fail "ctest -L unit exited $rc ($dir/logs/unit.log)"
pass "$(grep -E "tests passed" "$dir/logs/unit.log")"

# --- 6: nothing of this machine in the images ----------------------------------------------------
step 6 "nothing of here"
# What this machine adds: the certificates of its CA bundle that are not Debian's own (not in
# /usr/share/ca-certificates; a middle line of each, unique to it), the hosts and paths its pip
# configuration names, the secrets' mount point. None may be in a file of either image, nor in
# their metadata and history, nor in the repository.
needles=$dir/conf/needles.txt
: >"$needles"
if [ -f "$dir/conf/pip.conf" ]; then
  sed -n 's/^\(index-url\|extra-index-url\|find-links\|trusted-host\|proxy\|client-cert\) = //p' \
    "$dir/conf/pip.conf" | tr ' ' '\n' | sed 's|^[a-z+]*://\([^@/]*@\)\{0,1\}\([^/:]*\).*|\2|' |
    grep -v '^$' >>"$needles" || true
fi
cert=${cert:-}
machine_certs=0
middle_lines() {  # the middle line of each certificate's base64 in PEM files
  awk '/BEGIN CERT/ {n = 0; delete l; next} /END CERT/ {print l[int(n / 2)]; next} {l[n++] = $0}' "$@"
}
if [ -n "$cert" ] && [ -f "$cert" ]; then
  if [ -d /usr/share/ca-certificates ]; then
    find /usr/share/ca-certificates -name '*.crt' -exec cat {} + >"$dir/conf/debian-ca.crt"
  else  # not a Debian host: the image's bundle is the reference
    pm run --rm --network none --entrypoint cat "$IMAGE:build" /etc/ssl/certs/ca-certificates.crt \
      >"$dir/conf/debian-ca.crt"
  fi
  middle_lines "$dir/conf/debian-ca.crt" | sort -u >"$dir/conf/debian-ca.lines"
  while read -r line; do
    grep -qxF "$line" "$dir/conf/debian-ca.lines" ||
      { echo "$line" >>"$needles"; machine_certs=$((machine_certs + 1)); }
  done < <(middle_lines "$cert")
fi
echo "looking for $(wc -l <"$needles") strings: $machine_certs certificates this machine adds to" \
  "Debian's CA bundle, and the hosts and paths its pip configuration names"
for tag in latest build; do
  hits=$dir/conf/hits-$tag.txt
  mnt=$(pm image mount "$IMAGE:$tag")
  {
    if [ -s "$needles" ]; then
      grep -rlF -f "$needles" "$mnt" 2>/dev/null | sed "s|^$mnt||" | head -5
      { pm image inspect "$IMAGE:$tag"; pm history --no-trunc --format '{{.CreatedBy}}' "$IMAGE:$tag"; } |
        grep -F -f "$needles" | head -3
    fi
    # The secrets' mount point is gone (the runtime stage never had it); no pip.conf anywhere;
    # the compiler cache's mount point only where it was used, empty.
    ls -d "$mnt/run/pip-build" 2>/dev/null | sed "s|^$mnt||"
    find "$mnt" -xdev -name pip.conf 2>/dev/null | sed "s|^$mnt||"
    [ "$tag" = build ] || ls -d "$mnt/var/cache/gpurun-ccache" 2>/dev/null | sed "s|^$mnt||"
    find "$mnt/var/cache/gpurun-ccache" -mindepth 1 2>/dev/null | sed "s|^$mnt||" | head -3
  } >"$hits" || true
  pm image unmount "$IMAGE:$tag" >/dev/null
  [ ! -s "$hits" ] || fail "$IMAGE:$tag holds what it must not: $(tr '\n' ' ' <"$hits")"
  echo "$IMAGE:$tag: none in its files, its metadata or its history; no pip.conf, no mount point left"
done
if [ -s "$needles" ]; then
  repo_hits=$(git ls-files -z | xargs -0 grep -lF -f "$needles" 2>/dev/null || true)
  [ -z "$repo_hits" ] || fail "the repository holds this machine's configuration: $repo_hits"
  echo "the repository's files: none"
fi
pass "$machine_certs machine certificates and the pip configuration absent from both images"

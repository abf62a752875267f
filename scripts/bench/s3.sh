#!/usr/bin/env bash
# S3 checkpoint bench, side by side in one run against an S3 server on loopback (Ceph's RADOS
# Gateway, scripts/s3-gateway.sh, started here unless AWS_ENDPOINT_URL is set), on the state of
# scripts/bench/checkpoint.sh (about 421 MiB: MLP 784-4096-4096-4096 with Adam):
#  - the upload of one checkpoint end to end: gpurun's CheckpointStore::copy_from() from a local
#    root into s3://BUCKET/PREFIX (gpurun_bench_s3 upload: what the background copy from the
#    local tier does; multipart, 8 MiB parts, 4 in flight, each with Content-MD5, xxh3 checked
#    against the manifest as the bytes pass, manifest and LATEST last) against boto3's
#    upload_fileobj of the same files with TransferConfig(multipart_threshold=8 MiB,
#    multipart_chunksize=8 MiB, max_concurrency=4) (no checksum beyond what botocore sends by
#    default); median of 3 each, interleaved, the source files in the page cache for both;
#  - the download of it into an empty local root: gpurun's copy_from() of the bucket's folder
#    (gpurun_bench_s3 download: what a resume onto an empty disk does; ranged GETs of 8 MiB, 4 at
#    a time, xxh3 verified as the bytes arrive, fsync of every file and the folder) against
#    boto3's download_fileobj of the same objects into files, plain (nothing verified, nothing
#    fsync'd), then with xxh3 checked against the manifest as the bytes arrive (python3-xxhash,
#    when installed: the file object given to boto3 hashes and writes in order), then with that
#    and an fsync of every file and the folder as well (gpurun's guarantees); median of 3 each;
#  - the host memory an upload holds: the peak resident memory of gpurun_bench_s3 during the
#    upload above its resident memory before it (VmHWM - VmRSS, median of the 3 uploads), against
#    64 MiB + the parts in flight (4 x 8 MiB);
#  - the training stall of an asynchronous save with --ckpt s3://... (the local tier on, as by
#    default: saves land in $XDG_CACHE_HOME/gpurun/tiers/..., here under the bench's folder, and
#    are uploaded behind training) against a local folder --ckpt on the same disk: the median
#    `stall_seconds` of the `checkpoint` events of two runs of each; beside them, the gateway's
#    CPU seconds during the s3:// runs (with a gateway of its own: on this host the server shares
#    training's cores), and the stall of two runs whose local tier copies into a local folder
#    instead of the bucket (checkpoint.local_dir: the same copy behind training, without S3).
# Usage: scripts/bench/s3.sh [DIR]
# DIR: where the local checkpoints, the local tier and the downloads go (default: a temporary
# directory). With AWS_ENDPOINT_URL (and AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)
# set, that server is used instead of a gateway of its own: a bucket is created there
# (GPURUN_BENCH_BUCKET: an existing one is used instead) and what the bench wrote is removed.
# Needs a build (scripts/build.sh, or: ninja -C build gpurun gpurun_bench_s3), Debian's
# python3-boto3 (scripts/install-deps.sh), and for the verifying boto3 download python3-xxhash.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${1:-$(mktemp -d)}
mkdir -p "$target"
work=$(mktemp -d "$target/gpurun-bench-s3-XXXXXX")
work=$(cd "$work" && pwd)
python=/usr/bin/python3  # Debian's, with python3-boto3 (and python3-xxhash)
gw=""
bucket=""
made_bucket=""
prefix=bench-$$-$RANDOM
cleanup() {
  if [ -n "$gw" ]; then
    scripts/s3-gateway.sh stop "$gw" >/dev/null 2>&1 || true
    rm -rf "$gw"
  elif [ -n "$bucket" ]; then
    "$python" "$work/boto.py" rm "$bucket" "$prefix/" "$made_bucket" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
cat >"$work/boto.py" <<'PY'
# boto3's side: mkbucket B | rm B PREFIX [DROP_BUCKET] | upload DIR B KEYPREFIX |
# download B KEYPREFIX DIR plain|xxh3|xxh3-fsync. upload and download print their seconds; the
# client is made before the clock starts, as gpurun_bench_s3 opens its storages before it.
import json, os, sys, time
import boto3
from boto3.s3.transfer import TransferConfig
MiB = 1 << 20
config = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=4)
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
cmd, args = sys.argv[1], sys.argv[2:]

class Hashing:
    """A file object with write() alone: boto3 then writes the parts in order, so that the
    xxh3 of the bytes can be taken as they arrive, as gpurun's download does."""
    def __init__(self, f, h):
        self.f, self.h, self.n = f, h, 0
    def write(self, data):
        self.h.update(data)
        self.n += len(data)
        return self.f.write(data)

if cmd == "mkbucket":
    s3.create_bucket(Bucket=args[0])
elif cmd == "rm":
    bucket, prefix = args[0], args[1]
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})
    for u in s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", []):
        s3.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
    if len(args) > 2 and args[2]:
        s3.delete_bucket(Bucket=bucket)
elif cmd == "upload":
    folder, bucket, keyprefix = args
    # The data files, then manifest.json, as gpurun writes them.
    names = sorted(n for n in os.listdir(folder) if n != "manifest.json") + ["manifest.json"]
    start = time.perf_counter()
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            s3.upload_fileobj(f, bucket, f"{keyprefix}/{name}", Config=config)
    print(f"{time.perf_counter() - start:.6f}")
elif cmd == "download":
    bucket, keyprefix, folder, mode = args
    if mode != "plain":
        import xxhash
    os.makedirs(folder)
    start = time.perf_counter()
    manifest = s3.get_object(Bucket=bucket, Key=f"{keyprefix}/manifest.json")["Body"].read()
    for name, entry in json.loads(manifest)["files"].items():
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            if mode == "plain":
                s3.download_fileobj(bucket, f"{keyprefix}/{name}", f, Config=config)
                continue
            sink = Hashing(f, xxhash.xxh3_64())
            s3.download_fileobj(bucket, f"{keyprefix}/{name}", sink, Config=config)
            if sink.n != entry["bytes"] or sink.h.hexdigest() != entry["xxh3"]:
                sys.exit(f"{name} does not match the manifest: {sink.n} bytes, xxh3 {sink.h.hexdigest()}")
            if mode == "xxh3-fsync":
                f.flush()
                os.fsync(f.fileno())
    with open(os.path.join(folder, "manifest.json"), "wb") as f:
        f.write(manifest)
        if mode == "xxh3-fsync":
            f.flush()
            os.fsync(f.fileno())
    if mode == "xxh3-fsync":
        fd = os.open(folder, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    print(f"{time.perf_counter() - start:.6f}")
PY
if [ -z "${AWS_ENDPOINT_URL:-}" ]; then
  gw=$(mktemp -d /tmp/gw-bench-XXXXXX)
  # Room for what the bench stores before the gateway's garbage collection frees what it
  # deleted (about 6 GiB at most; memory is used only for what is stored).
  S3_GATEWAY_MEMSTORE_BYTES=${S3_GATEWAY_MEMSTORE_BYTES:-$((12 << 30))} \
    scripts/s3-gateway.sh start "$gw" >/dev/null
  # shellcheck disable=SC1091
  source "$gw/env"
fi
if [ -n "${GPURUN_BENCH_BUCKET:-}" ]; then
  bucket=$GPURUN_BENCH_BUCKET
else
  bucket=gpurun-bench-$$-$RANDOM
  "$python" "$work/boto.py" mkbucket "$bucket"
  made_bucket=1
fi
s3root="s3://$bucket/$prefix"
cp scripts/bench/checkpoint_state.yaml "$work/run.yaml"
gpurun() {  # gpurun with its output in $work/gpurun.log, shown when it fails
  if ! build/runner/gpurun "$@" >"$work/gpurun.log" 2>&1; then
    tail -20 "$work/gpurun.log" >&2
    return 1
  fi
}
gateway_cpu() {  # CPU milliseconds used so far by the gateway's daemons (0: a server not started here)
  local ticks=0 pid file
  for file in ${gw:+"$gw"/run/*.pid}; do
    pid=$(cat "$file" 2>/dev/null) && [ -r "/proc/$pid/stat" ] || continue
    ticks=$((ticks + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')))
  done
  echo $((ticks * 1000 / $(getconf CLK_TCK)))
}
# The stall: the same config saving to a local folder, then to the bucket through the local
# tier (the default for s3://), on the same disk ($XDG_CACHE_HOME under the bench's folder);
# two rounds, the saves of both runs of a kind pooled. The gateway's CPU time during the s3://
# runs is noted: on this host it shares the cores with training, as a real bucket would not.
# A third run of each round copies through the same local tier into a local folder instead of
# the bucket (checkpoint.local_dir, --ckpt a folder): the same copy behind training without S3's
# requests, parts in flight and server (a diagnostic of what the stall is made of; the goal is
# judged on the s3:// runs).
gw_ms=0 s3_ms=0
for i in 1 2; do
  gpurun "$work/run.yaml" --ckpt "$work/local-$i" --run-dir "$work/run-local-$i"
  before=$(gateway_cpu) start=$(date +%s%N)
  XDG_CACHE_HOME="$work/cache" gpurun "$work/run.yaml" --ckpt "$s3root/train-$i" --run-dir "$work/run-s3-$i"
  gw_ms=$((gw_ms + $(gateway_cpu) - before)) s3_ms=$((s3_ms + ($(date +%s%N) - start) / 1000000))
  gpurun "$work/run.yaml" --ckpt "$work/net-$i" --set checkpoint.local_dir="$work/tier" \
    --run-dir "$work/run-tiered-$i"
done
# The first local run's newest checkpoint is what is uploaded and downloaded; read once, so
# that both sides read it from the page cache (its saves wrote it around the cache).
name=$(basename "$(ls -d "$work"/local-1/ckpt-* | tail -1)")
cat "$work/local-1/$name"/* >/dev/null
bytes=$(cat "$work/local-1/$name"/* | wc -c)
# Three rounds, each gpurun then boto3, each upload into a prefix of its own.
up_gpurun="" up_boto3=""
for i in 1 2 3; do
  up_gpurun+=$(build/scripts/bench/gpurun_bench_s3 upload "$work/local-1" "$name" "$s3root/up-$i" | tr '\n' ' ')$'\n'
  up_boto3+=$("$python" "$work/boto.py" upload "$work/local-1/$name" "$bucket" "$prefix/boto3-$i/$name")$'\n'
done
# Downloads of the first gpurun upload into empty folders; each removed after it is timed.
have_xxhash=$("$python" -c 'import xxhash; print(1)' 2>/dev/null || echo 0)
modes="plain"
[ "$have_xxhash" = 1 ] && modes="plain xxh3 xxh3-fsync"
down_gpurun=""
declare -A down_boto3
for i in 1 2 3; do
  down_gpurun+=$(build/scripts/bench/gpurun_bench_s3 download "$s3root/up-1" "$name" "$work/down-gpurun" | tr '\n' ' ')$'\n'
  rm -rf "$work/down-gpurun"
  for mode in $modes; do
    down_boto3[$mode]+=$("$python" "$work/boto.py" download "$bucket" "$prefix/up-1/$name" "$work/down-boto3" "$mode")$'\n'
    rm -rf "$work/down-boto3"
  done
done
"$python" - "$work" "$name" "$bytes" "$gw_ms" "$s3_ms" "$up_gpurun" "$up_boto3" "$down_gpurun" \
  "${down_boto3[plain]}" "${down_boto3[xxh3]:-}" "${down_boto3[xxh3-fsync]:-}" <<'PY'
import json, os, statistics, sys
work, name, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
gw_seconds, s3_seconds = int(sys.argv[4]) / 1000, int(sys.argv[5]) / 1000
MiB = 2 ** 20
def runs(arg):  # gpurun_bench_s3's "key value" lines, one run a line
    out = []
    for line in arg.splitlines():
        words = line.split()
        out.append({k: float(v) for k, v in zip(words[::2], words[1::2])})
    return out
def seconds(arg):
    return [float(x) for x in arg.split()]
med = statistics.median
up_g, down_g = runs(sys.argv[6]), runs(sys.argv[8])
up_b, down_plain = seconds(sys.argv[7]), seconds(sys.argv[9])
down_xxh3, down_fsync = seconds(sys.argv[10]), seconds(sys.argv[11])
def fmt(xs):
    return ", ".join(f"{x:.2f}" for x in xs)
ok = []
print(f"checkpoint {name}: {nbytes / MiB:.1f} MiB in its files (manifest included)")
g, b = med(r["seconds"] for r in up_g), med(up_b)
print(f"upload, gpurun copy_from      : {g:6.2f} s  {nbytes / g / MiB:7.1f} MiB/s  (median of {fmt(r['seconds'] for r in up_g)})")
print(f"upload, boto3 upload_fileobj  : {b:6.2f} s  {nbytes / b / MiB:7.1f} MiB/s  (median of {fmt(up_b)})")
print(f"ratio upload boto3/gpurun     : {b / g:.2f}   (goal >= 1.0)")
ok.append(("upload boto3/gpurun", b / g, ">= 1.0", b / g >= 1.0))
g = med(r["seconds"] for r in down_g)
print(f"download, gpurun copy_from    : {g:6.2f} s  {nbytes / g / MiB:7.1f} MiB/s  (median of {fmt(r['seconds'] for r in down_g)}; xxh3 verified, fsync'd)")
for label, xs, what in (("plain", down_plain, "nothing verified, nothing fsync'd"),
                        ("+ xxh3", down_xxh3, "xxh3 checked as the bytes arrive"),
                        ("+ xxh3 + fsync", down_fsync, "and every file and the folder fsync'd")):
    if not xs:
        continue
    b = med(xs)
    print(f"{'download, boto3 ' + label:30}: {b:6.2f} s  {nbytes / b / MiB:7.1f} MiB/s  (median of {fmt(xs)}; {what})")
    print(f"{'  ratio boto3/gpurun':30}: {b / g:.2f}   (goal >= 1.0)")
    ok.append((f"download boto3 {label}/gpurun", b / g, ">= 1.0", b / g >= 1.0))
if not down_xxh3:
    print("  (python3-xxhash is not installed: boto3's download above verifies nothing)")
above = med(r["peak_above_bytes"] for r in up_g)
goal = 64 * MiB + 4 * 8 * MiB
print(f"host memory of an upload      : {above / MiB:6.1f} MiB above the {med(r['rss_before_bytes'] for r in up_g) / MiB:.0f} MiB resident before it (VmHWM - VmRSS, median of {fmt(r['peak_above_bytes'] / MiB for r in up_g)} MiB)")
print(f"  goal 64 MiB + 4 x 8 MiB     : {goal / MiB:6.1f} MiB, ratio {above / goal:.2f}   (goal <= 1.0)")
print(f"  and of a download           : {med(r['peak_above_bytes'] for r in down_g) / MiB:6.1f} MiB")
ok.append(("upload memory/goal", above / goal, "<= 1.0", above <= goal))
def events(runs, kind):
    return [json.loads(l) for run in runs for l in open(f"{work}/{run}/metrics.jsonl")
            if f'"event":"{kind}"' in l]
local = events(["run-local-1", "run-local-2"], "checkpoint")
s3 = events(["run-s3-1", "run-s3-2"], "checkpoint")
copied = events(["run-s3-1", "run-s3-2"], "checkpoint_copied")
sl, ss = med(e["stall_seconds"] for e in local), med(e["stall_seconds"] for e in s3)
print(f"training stall, --ckpt DIR    : {sl * 1000:6.1f} ms (median of {len(local)} saves: {fmt(e['stall_seconds'] * 1000 for e in local)} ms)")
print(f"training stall, --ckpt s3://  : {ss * 1000:6.1f} ms (median of {len(s3)} saves: {fmt(e['stall_seconds'] * 1000 for e in s3)} ms)")
if copied:
    print(f"  uploaded behind training    : {len(copied)} of them, {fmt(e['write_seconds'] for e in copied)} s each")
if gw_seconds:
    print(f"  the gateway's CPU meanwhile : {gw_seconds:6.1f} s in the {s3_seconds:.1f} s of the s3:// runs (radosgw and its OSD, on the same cores)")
print(f"ratio stall s3/local          : {ss / sl:.2f}   (goal <= 1.1)")
tiered = events(["run-tiered-1", "run-tiered-2"], "checkpoint")
st = med(e["stall_seconds"] for e in tiered)
tiered_copied = events(["run-tiered-1", "run-tiered-2"], "checkpoint_copied")
print(f"  local tier + a folder, no S3: {st * 1000:6.1f} ms (median of {len(tiered)} saves: {fmt(e['stall_seconds'] * 1000 for e in tiered)} ms; {len(tiered_copied)} copied), ratio {st / sl:.2f} to local")
ok.append(("stall s3/local", ss / sl, "<= 1.1", ss / sl <= 1.1))
missed = [what for what, _, _, good in ok if not good]
print("summary: " + "; ".join(f"{what} {value:.2f} ({'met' if good else 'MISSED'}: goal {goal})"
                              for what, value, goal, good in ok))
print("every goal met" if not missed else "goals missed: " + ", ".join(missed))
PY

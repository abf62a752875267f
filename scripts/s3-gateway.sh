#!/usr/bin/env bash
# NAME
#   s3-gateway.sh - a real S3 server on this host for the tests: Ceph's RADOS Gateway on a
#   one-monitor, one-OSD cluster that keeps its objects in memory
#
# SYNOPSIS
#   scripts/s3-gateway.sh start DIR
#   scripts/s3-gateway.sh stop [--keep-logs] DIR
#   scripts/s3-gateway.sh make-bucket DIR NAME
#
# DESCRIPTION
#   start creates DIR and starts, all its state under DIR (nothing in /etc/ceph or
#   /var/lib/ceph, its own fsid, so that two instances in two folders run side by side, as
#   ctest runs tests in parallel):
#     ceph-mon   on 127.0.0.1, msgr2 only, a free port
#     ceph-osd   objectstore memstore: objects live in the OSD's memory (up to MEMSTORE_BYTES)
#                and vanish with it; no disk, no block device, no mount
#     radosgw    beast on 127.0.0.1, a free port: path-style http://127.0.0.1:PORT/BUCKET/KEY,
#                and virtual-hosted http://BUCKET.localhost:PORT/KEY for clients that resolve
#                *.localhost (curl does, glibc does not)
#   and an S3 user with a generated key. It returns once a signed ListBuckets succeeds, prints
#   the endpoint, and writes DIR/env, lines to `source`:
#     export AWS_ENDPOINT_URL=http://127.0.0.1:PORT
#     export AWS_ACCESS_KEY_ID=...   AWS_SECRET_ACCESS_KEY=...
#     export AWS_REGION=us-east-1    (RGW signs with whatever region the client names; boto3
#                                     sends no LocationConstraint for us-east-1 alone)
#     export GPURUN_S3_GATEWAY_DIR=DIR
#   A start that fails stops what it started and prints the end of the failing daemon's log.
#
#   stop stops the daemons by their pid files (SIGTERM, up to 10 s, then SIGKILL), then any
#   process still running with DIR's ceph.conf, checks that none is left, and empties DIR
#   (DIR/log stays with --keep-logs).
#
#   make-bucket creates bucket NAME through the S3 API, as a client would.
#
# FILES
#   DIR/ceph.conf  the cluster's configuration: pass `-c DIR/ceph.conf` to ceph, rados and
#                  radosgw-admin to look inside
#   DIR/log/       the daemons' logs (mon.a.log, osd.0.log, client.rgw.gw.log, *.out)
#   DIR/run/       pid files and admin sockets
#
# EXIT STATUS
#   0 done; 77 a Ceph binary (or curl) is missing: tests take 77 as "skipped"; 1 anything else.
#
# ENVIRONMENT
#   S3_GATEWAY_MEMSTORE_BYTES  the OSD's capacity (default 8 GiB; only what is stored is used)
#
# NOTES
#   Memory: about 110 MB idle (monitor 31, OSD 42, gateway 33 MB RSS). The OSD holds about 1.6
#   bytes per byte stored (3 GiB of objects: 4.8 GB); what is deleted or overwritten is freed
#   by the gateway's garbage collector about 90 s later. Start takes about 12 s, stop about 1 s.
set -euo pipefail

die() { echo "s3-gateway: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

# The OSD reports this as its size; the monitor stops writes at 95% of it. Memory is used only
# for what is stored, so the ~3 GiB the tests write fit with room for RGW's index and logs.
MEMSTORE_BYTES=${S3_GATEWAY_MEMSTORE_BYTES:-$((8 * 1024 * 1024 * 1024))}
ACCESS_REGION=us-east-1
USER_ID=gpurun

# Whether `pid` still runs (a zombie, exited but not yet waited for, does not).
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# The pids of every process started with DIR's ceph.conf on its command line: the daemons and
# any ceph or radosgw-admin client of this instance (and nothing of another instance's).
instance_pids() {
  # The path comes in through a file: as an argument it would be on grep's own command line.
  grep -slzxF -f <(printf '%s\n' "$1") /proc/[0-9]*/cmdline |
    sed -n 's|^/proc/\([0-9]*\)/cmdline$|\1|p'
  return 0
}

# A TCP port nothing listens on, below the kernel's ephemeral range so that no outgoing
# connection (the daemons open many) takes it before the daemon binds it.
free_port() {
  local low _ port
  read -r low _ </proc/sys/net/ipv4/ip_local_port_range
  [ "$low" -gt 11000 ] || low=32768
  while :; do
    port=$((10000 + (RANDOM * 32768 + RANDOM) % (low - 10000)))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}

hex() { od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'; }

# curl signing with SigV4 as S3 clients do; the body's hash goes in x-amz-content-sha256,
# which RGW requires on every SigV4 request and curl 7.88 does not add itself.
s3_curl() {  # s3_curl ENV_FILE METHOD PATH [curl args...]
  local env=$1 method=$2 path=$3
  shift 3
  (
    # shellcheck disable=SC1090
    . "$env"
    curl -sS --max-time 10 -X "$method" \
      --aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
      -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
      "$@" "$AWS_ENDPOINT_URL$path"
  )
}

# DIR/env: what a test sources to reach the gateway.
write_env() {  # write_env DIR PORT ACCESS_KEY SECRET
  cat >"$1/env" <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$2
export AWS_ACCESS_KEY_ID=$3
export AWS_SECRET_ACCESS_KEY=$4
export AWS_REGION=$ACCESS_REGION
export GPURUN_S3_GATEWAY_DIR=$1
EOF
}

# Waits until a signed ListBuckets succeeds: 0. The gateway exited: 1 (its pid file goes with
# it, so it is looked for among the instance's processes). No answer in 60 s: 2.
wait_for_gateway() {  # wait_for_gateway DIR
  local deadline=$((SECONDS + 60)) reply pid
  until reply=$(s3_curl "$1/env" GET / 2>/dev/null) && [[ $reply == *ListAllMyBucketsResult* ]]; do
    [ "$SECONDS" -lt "$deadline" ] || return 2
    instance_pids "$1/ceph.conf" | while read -r pid; do cat "/proc/$pid/comm"; done 2>/dev/null |
      grep -qx radosgw || return 1
    sleep 0.2
  done
}

start() {
  local dir=$1 b
  for b in ceph-mon ceph-osd radosgw radosgw-admin ceph monmaptool curl; do
    command -v "$b" >/dev/null 2>&1 || {
      echo "s3-gateway: $b not found (apt install radosgw ceph-mon ceph-osd ceph-common curl)" >&2
      exit 77
    }
  done
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local conf=$dir/ceph.conf
  [ -z "$(instance_pids "$conf")" ] || die "an instance already runs in $dir; stop it first"
  rm -rf "${dir:?}"/{env,ceph.conf,monmap,mon,osd,rgw,run,log,crash}
  mkdir -p "$dir"/{mon/a,osd/0,rgw,run,log,crash}

  local fsid osd_uuid mon_port rgw_port access secret asok
  # The kernel's, rather than uuidgen's: uuid-runtime is not installed everywhere.
  fsid=$(cat /proc/sys/kernel/random/uuid)
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  mon_port=$(free_port)
  rgw_port=$(free_port)
  access=$(hex 10 | tr a-f A-F)
  secret=$(hex 20)
  # A unix socket's path holds at most 107 bytes: under a deep DIR the admin sockets, which
  # nothing here needs, are left out rather than failing the start.
  asok="$dir/run/\$name.asok"
  [ ${#dir} -lt 80 ] || asok=""

  cat >"$conf" <<EOF
# Written by scripts/s3-gateway.sh: one monitor, one in-memory OSD, one gateway, all on
# 127.0.0.1 and under $dir.
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
mon initial members = a
ms bind msgr1 = false
ms bind msgr2 = true
# One host, the tests its only users: no keys to hand around.
auth cluster required = none
auth service required = none
auth client required = none
# Without keys there is no encryption to ask for: radosgw asks for "secure" by default and
# would never connect.
ms mon client mode = crc
# A daemon that cannot reach the monitor gives up after this many seconds, not 300.
client mount timeout = 30
run dir = $dir/run
pid file = $dir/run/\$name.pid
admin socket = $asok
log file = $dir/log/\$name.log
mon cluster log file = $dir/log/cluster.log
crash dir = $dir/crash
keyring = $dir/keyring
log to syslog = false
err to syslog = false

# One copy of everything on one OSD, few placement groups, no autoscaler (it lives in
# ceph-mgr, which is not run).
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon warn on pool no app = false
mon warn on too few osds = false
mon warn on insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false

# The monitor shuts itself down when its disk is under mon_data_avail_crit percent free;
# the test machine's disk is not what this cluster is about.
mon data avail crit = 0
mon data avail warn = 0

[mon]
mon data = $dir/mon/\$id
# Small caches: the monitor holds a few maps.
mon memory autotune = false
mon memory target = 134217728
rocksdb cache size = 33554432

[osd]
osd data = $dir/osd/\$id
osd objectstore = memstore
memstore device bytes = $MEMSTORE_BYTES
osd memory target = 939524096
osd op num shards = 1
osd op num threads per shard = 2
# SIGTERM exits at once instead of unmounting, which for memstore means writing every object
# to osd data first.
osd fast shutdown = true

[client.rgw.gw]
rgw frontends = beast endpoint=127.0.0.1:$rgw_port
rgw data = $dir/rgw
rgw thread pool size = 32
# Virtual-hosted addressing for clients that resolve BUCKET.localhost to 127.0.0.1 (curl does,
# glibc does not); path-style, http://127.0.0.1:PORT/BUCKET/KEY, works without it.
rgw dns name = localhost
rgw exit timeout secs = 5
# A deleted or overwritten object's data is freed by the garbage collector, by default 2 h
# later, and memstore holds it in memory until then: a minute is enough for the tests.
rgw gc obj min wait = 60
rgw gc processor period = 60

[client.admin]
# The ceph and radosgw-admin commands: no admin socket per call.
admin socket =
log file = $dir/log/client.admin.log
EOF

  # From here on a failure (set -e, die) stops whatever was started.
  starting_dir=$dir
  trap 'fail_start "$starting_dir" $?' EXIT

  # Each daemon forks into the background; its stdout and stderr go to a file, so that none
  # holds the pipe of the ctest that ran this script open.
  #
  # Debian's Ceph uses glibc's malloc, whose mmap threshold grows with the first large free:
  # from then on the OSD's and the gateway's 4 MiB buffers come from the heap, and the heap
  # does not shrink (after 3 GiB written and deleted the OSD kept 1.5 GB). A fixed threshold
  # keeps them mmapped and returned on free (83 MB).
  export MALLOC_MMAP_THRESHOLD_=1048576
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" -i a --mkfs --monmap "$dir/monmap" >"$dir/log/mon.a.out" 2>&1
  ceph-mon -c "$conf" -i a >>"$dir/log/mon.a.out" 2>&1 </dev/null

  local id
  id=$(ceph -c "$conf" --connect-timeout 20 osd new "$osd_uuid")
  [ "$id" = 0 ] || die "ceph osd new gave id $id, not 0"
  ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >"$dir/log/osd.0.out" 2>&1
  ceph-osd -c "$conf" -i 0 >>"$dir/log/osd.0.out" 2>&1 </dev/null

  # radosgw-admin sets up the default realm, zone and their pools, waiting (without end,
  # hence the timeout) until the OSD is up; the gateway then finds them ready.
  timeout 120 radosgw-admin -c "$conf" user create --uid="$USER_ID" --display-name="gpurun tests" \
    --access-key="$access" --secret-key="$secret" >"$dir/log/user-create.out" 2>&1
  # The port was free when chosen, but another program (another instance starting at the
  # same moment) may have bound it since: a gateway that cannot bind gets another port.
  local attempt status
  for attempt in 1 2 3; do
    write_env "$dir" "$rgw_port" "$access" "$secret"
    radosgw -c "$conf" -n client.rgw.gw >>"$dir/log/client.rgw.gw.out" 2>&1 </dev/null
    status=0
    wait_for_gateway "$dir" || status=$?
    [ "$status" -eq 0 ] && break
    if [ "$status" -eq 1 ] && grep -q "failed to bind address" "$dir/log/client.rgw.gw.log"; then
      [ "$attempt" -lt 3 ] ||
        die "radosgw could not bind a port in 3 tries; see $dir/log/client.rgw.gw.log"
      rgw_port=$(free_port)
      sed -i "s|^rgw frontends = .*|rgw frontends = beast endpoint=127.0.0.1:$rgw_port|" "$conf"
      : >"$dir/log/client.rgw.gw.log"
      continue
    fi
    [ "$status" -eq 1 ] && die "radosgw exited; see $dir/log/client.rgw.gw.log"
    die "the gateway did not answer on 127.0.0.1:$rgw_port in 60 s"
  done
  trap - EXIT
  echo "http://127.0.0.1:$rgw_port"
}

fail_start() {
  local dir=$1 rc=$2 f
  trap - EXIT
  [ "$rc" -ne 0 ] || return 0
  echo "s3-gateway: start failed; the last lines of the logs in $dir/log:" >&2
  for f in "$dir"/log/*; do
    [ -s "$f" ] || continue
    echo "--- $f" >&2
    tail -n 5 "$f" >&2
  done
  stop "$dir" keep-logs >/dev/null 2>&1 || true
  exit 1
}

stop() {
  local dir=$1 keep_logs=${2:-} conf pids p name deadline
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd)
  conf=$dir/ceph.conf
  # The gateway first (it waits on the OSD while it shuts down), the monitor last.
  for name in client.rgw.gw osd.0 mon.a; do
    p=$(cat "$dir/run/$name.pid" 2>/dev/null) || continue
    # A recycled pid belongs to some other program: only one started with this ceph.conf.
    instance_pids "$conf" | grep -qx "$p" || continue
    kill -TERM "$p" 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while alive "$p" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    if alive "$p"; then kill -KILL "$p" 2>/dev/null || true; fi
  done
  # Anything else of this instance: a daemon whose pid file never got written, a client.
  pids=$(instance_pids "$conf")
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  fi
  for p in $(instance_pids "$conf"); do
    alive "$p" && die "process $p of $dir still runs: $(tr '\0' ' ' <"/proc/$p/cmdline")"
  done
  if [ "$keep_logs" = keep-logs ]; then
    find "$dir" -mindepth 1 -maxdepth 1 ! -name log -exec rm -rf {} +
  else
    find "$dir" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
  fi
}

cmd=${1:-}
case "$cmd" in
  start)
    [ $# -eq 2 ] || { usage >&2; exit 2; }
    start "$2" ;;
  stop)
    shift
    keep="" dir=""
    for arg in "$@"; do
      case "$arg" in
        --keep-logs) keep="keep-logs" ;;
        *) [ -z "$dir" ] || { usage >&2; exit 2; }; dir=$arg ;;
      esac
    done
    [ -n "$dir" ] || { usage >&2; exit 2; }
    stop "$dir" "$keep" ;;
  make-bucket)
    [ $# -eq 3 ] || { usage >&2; exit 2; }
    [ -f "$2/env" ] || die "no gateway runs in $2 ($2/env is missing)"
    reply=$(s3_curl "$2/env" PUT "/$3" -w '\n%{http_code}')
    [ "${reply##*$'\n'}" = 200 ] || die "creating bucket $3 failed: ${reply//$'\n'/ }" ;;
  -h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac

#!/bin/bash
# How long the store takes to catch up after a burst of random overwrites: A/B of lsvd
# builds. Each run serves a fresh 4 GiB volume (2 GiB write log, 1 GiB read cache,
# --no-probe), writes 4 KiB at random over its first GiB at QD32 (fio's nbd engine)
# for CATCH_UP_RUNTIME seconds (default 15), then stops all client I/O and times how
# long until nothing is left in the write log or the upload queue (the metrics
# endpoint), and until the store is back within live/--gc-start (utilization at least
# CATCH_UP_UTIL, default 0.70, no GC pass in flight: what --gc-headroom let GC leave
# for later is done). Builds alternate, ROUNDS times.
#
#   bench/catch_up.sh [ROUNDS] NAME=BINARY[:serve args] ...
#   scripts/with-versitygw.sh bench/catch_up.sh 1 old=BIN new=BIN   # store in versitygw
#
# Under scripts/with-versitygw.sh (LSVD_TEST_S3_BUCKET set) the volume's store is a
# fresh prefix of that bucket; otherwise the local store. Prints one line per run
# (IOPS during the burst, catch-up seconds, MB GC moved and MB written to the store
# while catching up, seconds until the store is within its bound, store MB when the
# burst ended) and the medians.
set -u
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
rounds=${1:-1}; shift
[ $# -ge 1 ] || { echo "usage: $0 ROUNDS NAME=BINARY[:ARGS]..." >&2; exit 2; }
runtime=${CATCH_UP_RUNTIME:-15}
tmp=$(mktemp -d /tmp/lsvd-catchup.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

run_one() { # NAME BINARY ARGS -> "NAME IOPS CATCH_UP_S GC_MB STORE_MB"
  local name=$1 bin=$2 args=$3 data="$tmp/data.$RANDOM" port store=()
  port=$(free_port)
  if [ -n "${LSVD_TEST_S3_BUCKET:-}" ]; then
    store=(--store "s3://$LSVD_TEST_S3_BUCKET/catch-up-$RANDOM$RANDOM")
  fi
  # With the store in S3, `create` writes nothing under --data: make it for the logs.
  mkdir -p "$data"
  "$bin" --data "$data" "${store[@]}" create vol --size 4G >/dev/null || exit 1
  # shellcheck disable=SC2086
  "$bin" --data "$data" "${store[@]}" serve vol --socket "$data/nbd.sock" \
    --log-size 2G --read-cache-size 1G --metrics "127.0.0.1:$port" --no-probe $args \
    >"$data/server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 300); do [ -S "$data/nbd.sock" ] && break; sleep 0.1; done
  fio --name=burst --output-format=json --output="$tmp/fio.json" --ioengine=nbd \
    "--uri=nbd+unix:///vol?socket=$data/nbd.sock" --size=1G --time_based \
    "--runtime=$runtime" --randrepeat=0 --norandommap --rw=randwrite --bs=4k \
    --iodepth=32 >/dev/null || exit 1
  python3 - "$tmp/fio.json" "$name" "$port" "${CATCH_UP_UTIL:-0.70}" <<'EOF'
import json, sys, time, urllib.request
path, name, port, compact_util = sys.argv[1:]
compact_util = float(compact_util)
text = open(path).read()
iops = json.loads(text[text.index('{'):])['jobs'][0]['write']['iops']

def metrics():
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    vals = {}
    for line in body.splitlines():
        if line.startswith("lsvd_") and " " in line:
            key, value = line.rsplit(" ", 1)
            key = key.split("{")[0]
            vals[key] = vals.get(key, 0) + float(value)
    return vals

t0, first = time.time(), metrics()
took, moved, stored = None, 0.0, 0.0
while True:
    now = metrics()
    if took is None and now.get("lsvd_log_used_bytes", 1) == 0 \
            and now.get("lsvd_uploads_pending", 1) == 0:
        took = time.time() - t0
        moved = (now["lsvd_gc_moved_bytes_total"] - first["lsvd_gc_moved_bytes_total"]) / 1e6
        stored = (now["lsvd_store_write_bytes_total"] - first["lsvd_store_write_bytes_total"]) / 1e6
    # Then the store back within live/--gc-start (0.70 unless the args change it):
    # what GC left for later during the burst (--gc-headroom) is done.
    if took is not None and now.get("lsvd_utilization", 0) >= compact_util \
            and now.get("lsvd_gc_pass_in_flight", 1) == 0:
        break
    if time.time() - t0 > 1800:
        print(f"{name}: the store did not catch up within 1800 s", file=sys.stderr)
        took = float("nan") if took is None else took
        break
    time.sleep(0.5)
compacted = time.time() - t0
print(f"{name} {iops:.0f} {took:.1f} {moved:.0f} {stored:.0f} {compacted:.1f} "
      f"{first['lsvd_store_bytes'] / 1e6:.0f}")
EOF
  kill -INT "$pid"; wait "$pid"
  rm -rf "$data"
}

echo "name iops catch_up_s gc_moved_mb store_written_mb compacted_s store_mb_after_burst"
for _ in $(seq 1 "$rounds"); do
  for spec in "$@"; do
    parse_spec "$spec"
    run_one "$name" "$bin" "$args" | tee -a "$tmp/results"
  done
done
echo "medians:"
# Columns: name, then iops catch_up_s gc_moved_mb store_written_mb compacted_s
# store_mb_after_burst.
medians "$tmp/results" 1 "{0} iops {1:.0f} catch-up {2:.1f} s gc moved {3:.0f} MB \
store written {4:.0f} MB; store {6:.0f} MB after the burst, within \
live/gc-start after {5:.1f} s ({n} runs)"

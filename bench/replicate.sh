#!/bin/bash
# Replication into an S3 server: throughput of a full copy, and the replica's lag
# while a server takes a steady 4 KiB random-write load. See bench/README.md,
# "Replication".
#
#   scripts/with-versitygw.sh bench/replicate.sh [SIZE] [LOAD_IOPS] [SECONDS]
#
# The source is a local file store; the replica a prefix of the bucket
# with-versitygw.sh made. SIZE (default 1G) is written sequentially, synced and copied
# with `lsvd replicate` (timed; compared with a plain `cp -r` of the source store in
# the same run). Then `lsvd replicate --follow --interval-ms 1000 --metrics` runs while
# fio writes 4 KiB blocks at random at LOAD_IOPS (default 1000) for SECONDS (default
# 60), and the lag metrics are sampled every second. Needs fio (nbd engine) and curl.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
LSVD=${LSVD:-$here/../target/release/lsvd}
size=${1:-1G}
iops=${2:-1000}
seconds=${3:-60}
d=$(mktemp -d /tmp/lsvd-replicate.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
target="s3://$LSVD_TEST_S3_BUCKET/bench-replica-$$"
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

"$LSVD" --data "$d" create vol --size "$size" >/dev/null
"$LSVD" --data "$d" serve vol --no-probe --socket "$d/nbd.sock" >"$d/server.log" 2>&1 &
server=$!
for _ in $(seq 1 300); do [ -S "$d/nbd.sock" ] && break; sleep 0.2; done
uri="nbd+unix:///vol?socket=$d/nbd.sock"
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1m --iodepth=8 \
    --size="$size" --output-format=terse >/dev/null
"$LSVD" --data "$d" sync vol >/dev/null
store_bytes=$(du -sb "$d/store" | cut -f1)

start=$(date +%s.%N)
cp -r "$d/store" "$d/store-copy"
cp_s=$(echo "$(date +%s.%N) - $start" | bc)
start=$(date +%s.%N)
"$LSVD" --data "$d" replicate vol --to "$target" --jobs 4 | tee "$d/full.txt"
full_s=$(echo "$(date +%s.%N) - $start" | bc)
echo "full copy: $store_bytes bytes in $full_s s ($(echo "$store_bytes / $full_s / 1000000" | bc -l | cut -c1-6) MB/s); cp -r of the same store: $cp_s s"

port=$(free_port)
"$LSVD" --data "$d" replicate vol --to "$target" --follow --interval-ms 1000 \
    --metrics "127.0.0.1:$port" >"$d/follow.txt" 2>&1 &
follow=$!
fio --name=load --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=4 \
    --rate_iops="$iops" --time_based --runtime="$seconds" --size="$size" \
    --output-format=terse >/dev/null &
load=$!
: >"$d/lag.txt"
for _ in $(seq 1 "$seconds"); do
    sleep 1
    curl -s "http://127.0.0.1:$port/metrics" | awk '
        /^lsvd_replication_lag_seconds/ {s=$2} /^lsvd_replication_lag_objects/ {o=$2}
        END {print s, o}' >>"$d/lag.txt"
done
wait "$load"
sort -n "$d/lag.txt" | awk '{s[NR]=$1} END {
    printf "lag seconds under %s IOPS of 4 KiB random writes: median %.1f, p90 %.1f, max %.1f (%d samples)\n",
        "'"$iops"'", s[int(NR/2)+1], s[int(NR*0.9)+1], s[NR], NR }'
sort -n -k2 "$d/lag.txt" | awk '{o[NR]=$2} END {
    printf "lag objects (copied per pass): median %d, max %d\n", o[int(NR/2)+1], o[NR] }'
kill -INT "$follow"; wait "$follow" || true
kill -INT "$server"; wait "$server" || true

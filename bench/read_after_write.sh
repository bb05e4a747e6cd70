#!/bin/bash
# Reads of recently written data with the store in S3: the sequence of bench/run.sh for
# one target (1 GiB written sequentially, 4 KiB random writes QD32, then 4 KiB random
# reads QD32 and a 70/30 mix QD32, each job started with the store caught up), served
# with a 2 GiB write log and a 1 GiB read cache by several lsvd binaries in
# alternation, each on a fresh volume. Read-cache hits and misses and GETs come from
# the metrics endpoint. Run under an S3 server:
#
#   scripts/with-versitygw.sh bench/read_after_write.sh [ROUNDS] NAME=BINARY[:serve args] ...
#
#   e.g. bench/read_after_write.sh 2 before=/tmp/lsvd-old after=target/release/lsvd
#
# RAW_RUNTIME (seconds per job, default 15) shortens it. Prints one line per job and
# run (name, job, IOPS, cache hits, misses, GETs) and the medians.
set -u
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
rounds=${1:-2}; shift
[ $# -ge 1 ] || { echo "usage: $0 ROUNDS NAME=BINARY[:ARGS]..." >&2; exit 2; }
: "${LSVD_TEST_S3_BUCKET:?run under scripts/with-versitygw.sh}"
runtime=${RAW_RUNTIME:-15}
tmp=$(mktemp -d /var/tmp/lsvd-raw.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
metric() { # PORT NAME -> value (summed over labels)
  curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m || index($1, m "{") == 1 {v += $2} END {printf "%.0f\n", v}'
}
settle() { # PORT: wait until nothing is left in the write log or queued for upload
  for _ in $(seq 1 1200); do
    [ "$(metric "$1" lsvd_log_used_bytes)" = 0 ] && [ "$(metric "$1" lsvd_uploads_pending)" = 0 ] && return 0
    sleep 0.5
  done
  echo "store did not catch up in 600 s" >&2
}
results=$tmp/results.txt
for r in $(seq 1 "$rounds"); do
  for spec in "$@"; do
    parse_spec "$spec"
    d=$tmp/$name-$r; mkdir -p "$d"; p=$(port)
    store="s3://$LSVD_TEST_S3_BUCKET/raw-$$-$name-$r"
    "$bin" --data "$d" --store "$store" create vol --size 4G >/dev/null || exit 1
    # shellcheck disable=SC2086
    "$bin" --data "$d" --store "$store" serve vol --socket "$d/nbd.sock" --metrics "127.0.0.1:$p" \
      --log-size 2G --read-cache-size 1G $args >"$d/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
      grep -q "metrics on" "$d/server.log" && [ -S "$d/nbd.sock" ] && break
      sleep 0.1
    done
    [ -S "$d/nbd.sock" ] || { echo "serve did not start: $(cat "$d/server.log")" >&2; exit 1; }
    fio_args=(--name=job --output-format=json --ioengine=nbd "--uri=nbd+unix:///vol?socket=$d/nbd.sock" --size=1G)
    fio "${fio_args[@]}" --rw=write --bs=1m --iodepth=8 >/dev/null || exit 1
    settle "$p"
    for job in randwrite randread mix; do
      case $job in
        randwrite) rw=(--rw=randwrite) ;;
        randread) rw=(--rw=randread) ;;
        mix) rw=(--rw=randrw --rwmixread=70) ;;
      esac
      h0=$(metric "$p" lsvd_read_cache_hits_total); m0=$(metric "$p" lsvd_read_cache_misses_total)
      g0=$(metric "$p" lsvd_store_gets_total)
      fio "${fio_args[@]}" "${rw[@]}" --bs=4k --iodepth=32 --time_based "--runtime=$runtime" \
        --randrepeat=0 --norandommap --output="$d/fio.json" >/dev/null || exit 1
      iops=$(python3 -c 'import json,sys;j=json.load(open(sys.argv[1]))["jobs"][0];print("%.0f" % (j["read"]["iops"] + j["write"]["iops"]))' "$d/fio.json")
      h1=$(metric "$p" lsvd_read_cache_hits_total); m1=$(metric "$p" lsvd_read_cache_misses_total)
      g1=$(metric "$p" lsvd_store_gets_total)
      echo "$name $job $iops $((h1 - h0)) $((m1 - m0)) $((g1 - g0))" | tee -a "$results"
      settle "$p"
    done
    kill -INT "$pid"; wait "$pid"
    rm -rf "$d"
  done
done
echo "median of $rounds (IOPS, read-cache hits, misses, GETs):"
# Columns: name job iops hits misses gets.
medians "$results" 2 \
  "{0:16} {1:10} {2:8.0f} IOPS  hits {3:8.0f}  misses {4:7.0f}  GETs {5:7.0f}"

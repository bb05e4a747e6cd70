#!/bin/bash
# Cold-cache reads from S3: sequential 1 MiB reads (QD1) and 4 KiB random reads (QD32)
# of a volume whose data is all in the store, each served from a fresh data directory
# (empty read cache, empty write log), by several lsvd binaries in alternation; GETs
# counted from lsvd_store_gets_total. Run under an S3 server:
#
#   scripts/with-versitygw.sh bench/read_path.sh [ROUNDS] NAME=BINARY[:serve args] ...
#
#   e.g. bench/read_path.sh 3 before=/tmp/lsvd-old after=target/release/lsvd \
#        "after-no-ahead=target/release/lsvd:--read-ahead 0"
#
# Prints one line per run (name, job, MB/s or IOPS, GETs) and the medians.
set -u
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
rounds=${1:-3}; shift
[ $# -ge 1 ] || { echo "usage: $0 ROUNDS NAME=BINARY[:ARGS]..." >&2; exit 2; }
: "${LSVD_TEST_S3_BUCKET:?run under scripts/with-versitygw.sh}"
size=${READ_PATH_SIZE:-512M}
first=${1#*=}; first=${first%%:*}
tmp=$(mktemp -d /tmp/lsvd-readpath.XXXXXX)
store="s3://$LSVD_TEST_S3_BUCKET/readpath-$$"
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
gets() { curl -s "http://127.0.0.1:$1/metrics" | awk '/^lsvd_store_gets_total/ {print $2}'; }
serve() { # BINARY DATA PORT ARGS... ; sets $pid
  local bin=$1 data=$2 p=$3; shift 3
  "$bin" --data "$data" --store "$store" serve vol --socket "$data/nbd.sock" \
    --metrics "127.0.0.1:$p" --log-size 64M --read-cache-size "${READ_PATH_CACHE:-1G}" "$@" \
    >"$data/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    grep -q "metrics on" "$data/server.log" && [ -S "$data/nbd.sock" ] && return 0
    sleep 0.1
  done
  echo "serve did not start: $(cat "$data/server.log")" >&2; exit 1
}
stop() { kill -INT "$pid"; wait "$pid"; }
fio_run() { # SOCKET ARGS... -> JSON on stdout (fio's nbd engine prints a line first)
  local s=$1; shift
  fio --name=job --output-format=json --output="$tmp/fio.json" --ioengine=nbd \
    "--uri=nbd+unix:///vol?socket=$s" --direct=1 "--size=$size" "$@" >/dev/null &&
    cat "$tmp/fio.json"
}

# Fill the volume once; a clean stop uploads everything.
mkdir -p "$tmp/fill"
"$first" --data "$tmp/fill" --store "$store" create vol --size "$size" >/dev/null || exit 1
serve "$first" "$tmp/fill" "$(port)"
fio_run "$tmp/fill/nbd.sock" --rw=write --bs=1m --iodepth=8 --refill_buffers >/dev/null || exit 1
stop

results=$tmp/results.txt
for r in $(seq 1 "$rounds"); do
  for spec in "$@"; do
    parse_spec "$spec"
    for job in seq1m rand4k; do
      d=$tmp/$name-$r-$job; mkdir -p "$d"; p=$(port)
      # shellcheck disable=SC2086
      serve "$bin" "$d" "$p" $args
      g0=$(gets "$p")
      if [ $job = seq1m ]; then
        out=$(fio_run "$d/nbd.sock" --rw=read --bs=1m --iodepth=1)
        val=$(echo "$out" | python3 -c 'import json,sys;print("%.0f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/1e6))')
      else
        out=$(fio_run "$d/nbd.sock" --rw=randread --bs=4k --iodepth=32 --time_based --runtime=10 --randseed=$r)
        val=$(echo "$out" | python3 -c 'import json,sys;print("%.0f" % json.load(sys.stdin)["jobs"][0]["read"]["iops"])')
      fi
      g1=$(gets "$p")
      stop
      echo "$name $job $val $((${g1%.*} - ${g0%.*}))" | tee -a "$results"
      rm -rf "$d"
    done
  done
done
echo "median of $rounds (MB/s for seq1m, IOPS for rand4k; GETs):"
# Columns: name job value gets.
medians "$results" 2 "{0:20} {1:7} {2:>10.0f} GETs {3:>8.0f}"
rm -rf "$tmp"

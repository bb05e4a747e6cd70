#!/bin/bash
# A/B of lsvd builds on the local store: each build serves a fresh volume for each job
# (fio's nbd engine, one connection unless said), builds in alternation, ROUNDS times.
#
#   bench/local_ab.sh [ROUNDS] NAME=BINARY[:serve args] ...
#
#   e.g. bench/local_ab.sh 3 before=/tmp/lsvd-old after=target/release/lsvd
#
# Jobs: 4 KiB write + fsync QD1; 4 KiB random write QD32; 4 KiB random read QD32 and
# QD1 (after a sequential fill, so reads hit written data); 1 MiB sequential write
# QD8; 4 KiB random write over 4 connections at QD8 each. LOCAL_AB_JOBS picks some
# (space-separated names), LOCAL_AB_RUNTIME sets seconds per job (default 6),
# LOCAL_AB_FIO_ARGS adds fio options to every job and fill (e.g. `--refill_buffers` for
# data that does not compress, `--refill_buffers --buffer_compress_percentage=50`).
# A build whose serve args give `--key-file K` serves an encrypted volume (created
# with `--encrypt --key-file K`).
# Prints one line per run and the medians (IOPS, MB/s for the sequential write).
set -u
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
rounds=${1:-3}; shift
[ $# -ge 1 ] || { echo "usage: $0 ROUNDS NAME=BINARY[:ARGS]..." >&2; exit 2; }
runtime=${LOCAL_AB_RUNTIME:-6}
jobs=${LOCAL_AB_JOBS:-"sync-qd1 randwrite-qd32 randread-qd32 randread-qd1 seqwrite-1m-qd8 randwrite-4conn"}
tmp=$(mktemp -d /tmp/lsvd-localab.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

job_args() { # JOB -> fio arguments
  case $1 in
    sync-qd1) echo "--rw=randwrite --bs=4k --iodepth=1 --fsync=1" ;;
    randwrite-qd32) echo "--rw=randwrite --bs=4k --iodepth=32" ;;
    randread-qd32) echo "--rw=randread --bs=4k --iodepth=32" ;;
    randread-qd1) echo "--rw=randread --bs=4k --iodepth=1" ;;
    seqwrite-1m-qd8) echo "--rw=write --bs=1M --iodepth=8" ;;
    randwrite-4conn) echo "--rw=randwrite --bs=4k --iodepth=8 --numjobs=4" ;;
    *) echo "unknown job $1" >&2; exit 2 ;;
  esac
}

run_one() { # NAME BINARY ARGS JOB -> "NAME JOB VALUE"
  local name=$1 bin=$2 args=$3 job=$4 data="$tmp/data.$RANDOM" encrypt=()
  if [[ " $args " =~ " --key-file "([^ ]+)" " ]]; then
    encrypt=(--encrypt --key-file "${BASH_REMATCH[1]}")
  fi
  "$bin" --data "$data" create vol --size 2G "${encrypt[@]}" >/dev/null || exit 1
  # shellcheck disable=SC2086
  "$bin" --data "$data" serve vol --socket "$data/nbd.sock" --log-size 2G \
    --read-cache-size 512M --no-probe $args >"$data/server.log" 2>&1 &
  local pid=$!
  # Making a 2 GiB write log takes half a minute on a slow disk: wait up to 3 minutes,
  # and not at all for a server that exited.
  for _ in $(seq 1 1800); do
    [ -S "$data/nbd.sock" ] && break
    kill -0 "$pid" 2>/dev/null || { echo "$name: lsvd serve exited: $(tail -2 "$data/server.log")" >&2; exit 1; }
    sleep 0.1
  done
  local uri="nbd+unix:///vol?socket=$data/nbd.sock"
  if [[ $job == randread-* ]]; then
    # shellcheck disable=SC2086
    fio --name=fill --ioengine=nbd "--uri=$uri" --rw=write --bs=1M --iodepth=8 \
      --size=1G ${LOCAL_AB_FIO_ARGS:-} >/dev/null || exit 1
  fi
  # shellcheck disable=SC2046,SC2086
  fio --name=job --output-format=json --output="$tmp/fio.json" --ioengine=nbd \
    "--uri=$uri" --size=1G --time_based "--runtime=$runtime" --randrepeat=0 \
    --norandommap --group_reporting $(job_args "$job") ${LOCAL_AB_FIO_ARGS:-} >/dev/null || exit 1
  kill -INT "$pid"; wait "$pid"
  rm -rf "$data"
  python3 - "$tmp/fio.json" "$name" "$job" <<'EOF'
import json, sys
path, name, job = sys.argv[1:]
text = open(path).read()
j = json.loads(text[text.index('{'):])['jobs'][0]
side = j['read'] if 'randread' in job else j['write']
value = side['bw_bytes'] / 1e6 if job.startswith('seqwrite') else side['iops']
print(f"{name} {job} {value:.0f}")
EOF
}

for _ in $(seq 1 "$rounds"); do
  for job in $jobs; do
    for spec in "$@"; do
      parse_spec "$spec"
      run_one "$name" "$bin" "$args" "$job" | tee -a "$tmp/results"
    done
  done
done
echo "medians (IOPS; MB/s for seqwrite):"
# Columns: name job value.
medians "$tmp/results" 2 "  {1:18} {0:12} {2:10.0f}  ({each})"

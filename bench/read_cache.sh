#!/bin/bash
# Read-cache hit rate of one trace, with and without `lsvd replay --precondition`,
# each against a fresh `lsvd serve` (32 GiB volume, default 1 GiB read cache and log,
# local file store). See bench/README.md, "Read cache hit rate".
#
#   bench/read_cache.sh NAME TRACE FORMAT [extra lsvd replay options...]
#
# Writes bench/results/read-cache/NAME-{pre,cold}.json; needs a release build.
set -u
here=$(cd "$(dirname "$0")" && pwd)
LSVD=${LSVD:-$here/../target/release/lsvd}
name=$1; trace=$2; fmt=$3; shift 3
out=$here/results/read-cache; mkdir -p "$out"
for mode in pre cold; do
  d=$(mktemp -d /tmp/lsvd-rc.XXXXXX)
  "$LSVD" --data "$d" create vol --size 32G >/dev/null || exit 1
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  "$LSVD" --data "$d" serve vol --socket "$d/nbd.sock" --metrics "127.0.0.1:$port" >"$d/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    grep -q "metrics on" "$d/server.log" && [ -S "$d/nbd.sock" ] && break
    sleep 0.2
  done
  extra=(); [ "$mode" = pre ] && extra=(--precondition)
  "$LSVD" replay "$trace" --format "$fmt" --export "nbd+unix:///vol?socket=$d/nbd.sock" \
    --metrics "http://127.0.0.1:$port/metrics" --verify --json "${extra[@]}" "$@" \
    >"$out/$name-$mode.json"
  echo "$name $mode: exit $?"
  kill -INT "$pid"; wait "$pid"
  rm -rf "$d"
done

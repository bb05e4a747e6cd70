#!/usr/bin/env bash
# Instructions per 4 KiB client write of `lsvd serve`, counted by callgrind: stable on
# a noisy machine where timings are not.
#
#   bench/callgrind.sh [--writes N] [--qd DEPTH] [--fsync-every K] [--lsvd BIN] [-- SERVE_ARGS...]
#
# Runs the server under callgrind twice from fresh data directories, once with N and
# once with 3N random 4 KiB writes from fio (NBD, queue depth DEPTH; with
# --fsync-every K, a FLUSH after every K writes), stops it with SIGINT (which drains,
# uploads everything and checkpoints), and prints (I(3N) - I(N)) / 2N: what one more
# write costs in every thread of the process, uploads included. Startup, shutdown and
# other fixed costs cancel out. CALLGRIND_FIO_ARGS adds fio options (e.g.
# `--refill_buffers` for data that does not compress). Needs valgrind and fio
# (apt-get install valgrind fio).
set -euo pipefail
cd "$(dirname "$0")/.."

writes=2000
qd=1
fsync_every=0
lsvd=""
serve_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --writes) writes=$2; shift 2 ;;
        --qd) qd=$2; shift 2 ;;
        --fsync-every) fsync_every=$2; shift 2 ;;
        --lsvd) lsvd=$2; shift 2 ;;
        --) shift; serve_args=("$@"); break ;;
        *) echo "usage: $0 [--writes N] [--qd DEPTH] [--fsync-every K] [--lsvd BIN] [-- SERVE_ARGS...]" >&2; exit 2 ;;
    esac
done
for tool in valgrind fio; do
    command -v "$tool" >/dev/null || { echo "callgrind.sh: needs $tool (apt-get install $tool)" >&2; exit 1; }
done
if [[ -z "$lsvd" ]]; then
    cargo build --release --locked -p lsvd >/dev/null
    lsvd="${CARGO_TARGET_DIR:-target}/release/lsvd"
fi

scratch=$(mktemp -d /var/tmp/lsvd-callgrind.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
trap 'exit 130' INT TERM HUP

# Total instructions of one serve run with $1 writes.
count() {
    local n=$1 dir="$scratch/run-$1"
    mkdir -p "$dir"
    # Serve args with `--key-file K`: the volume is created encrypted with that key.
    local encrypt=() i
    for ((i = 0; i + 1 < ${#serve_args[@]}; i++)); do
        [[ ${serve_args[i]} == --key-file ]] && encrypt=(--encrypt --key-file "${serve_args[i + 1]}")
    done
    "$lsvd" --data "$dir/data" create vol --size 1G "${encrypt[@]}" >/dev/null
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
        "$lsvd" --data "$dir/data" serve vol --socket "$dir/nbd.sock" --no-probe "${serve_args[@]}" \
        >"$dir/serve.log" 2>&1 &
    local pid=$!
    for _ in $(seq 600); do
        [[ -S "$dir/nbd.sock" ]] && break
        sleep 0.1
    done
    [[ -S "$dir/nbd.sock" ]] || { cat "$dir/serve.log" >&2; exit 1; }
    local sync=()
    [[ "$fsync_every" -gt 0 ]] && sync=("--fsync=$fsync_every")
    fio --name=w --ioengine=nbd --uri="nbd+unix:///vol?socket=$dir/nbd.sock" \
        --rw=randwrite --bs=4k --iodepth="$qd" --number_ios="$n" --size=256M \
        --randrepeat=1 --randseed=42 "${sync[@]}" ${CALLGRIND_FIO_ARGS:-} --output=/dev/null
    kill -INT "$pid"
    wait "$pid" || { cat "$dir/serve.log" >&2; exit 1; }
    # "summary: N" (or "totals: N") is the whole process's instruction count.
    awk '/^(summary|totals):/ {print $2; exit}' "$dir/cg.out"
}

small=$(count "$writes")
large=$(count $((3 * writes)))
per_write=$(( (large - small) / (2 * writes) ))
echo "instructions per 4 KiB write (QD $qd, fsync every ${fsync_every:-0}): $per_write"
echo "  ($writes writes: $small instructions; $((3 * writes)) writes: $large)"

#!/usr/bin/env bash
# Benchmark lsvd against its peers on this machine, in one run.
#
#   bench/run.sh [--quick] [--no-s3] [--tls] [--probe] [--pgbench] [--out DIR] [--dir SCRATCH]
#
# Targets: fio on a raw file (the device), nbdkit memory (the NBD ceiling), qemu-nbd on
# a raw file, lsvd on the local store, lsvd on versitygw and s3backer on versitygw (an
# S3 server on loopback, started for the run by scripts/with-versitygw.sh; --no-s3
# leaves those two out). Jobs: 4 KiB random write QD32, 4 KiB random read QD32
# (written volume), 1 MiB sequential write, 4 KiB write+fsync QD1, 70/30 random mix
# QD32, 4 KiB random write over 4 connections at QD8 each. Writes a markdown table, JSON and an SVG chart to the output dir
# (bench/results by default). --tls first runs bench/tls.sh (4 KiB random write IOPS
# over loopback TCP, plain vs NBD over TLS, median of 3). --probe adds lsvd on the local
# store after `lsvd probe` of its data directory, with the default target held to the
# built-in settings (--no-probe, where serve has it), and a table of probed / default
# IOPS per job. --pgbench then runs bench/pgbench.sh (PostgreSQL pgbench on ext4 on
# qemu-nbd, lsvd and s3backer; needs root; results in pgbench.{md,json}), with --quick,
# --no-s3, --out and --dir passed on. Not part of CI: numbers on a shared 2-core machine are
# noisy; read the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."

s3=1
tls=""
pgbench=""
pgbench_args=()
args=()
prev=""
for a in "$@"; do
    case "$a" in
        --no-s3) s3="" ; pgbench_args+=(--no-s3) ;;
        --tls) tls=1 ;;
        --pgbench) pgbench=1 ;;
        --s3) ;; # the default; accepted for old command lines
        *)
            args+=("$a")
            [[ "$a" == --quick ]] && pgbench_args+=(--quick)
            [[ "$prev" == --out ]] && pgbench_args+=(--out "$a")
            [[ "$a" == --out=* ]] && pgbench_args+=("$a")
            [[ "$prev" == --dir ]] && pgbench_args+=(--dir "$a")
            ;;
    esac
    prev="$a"
done
if [[ -n "$pgbench" && "$(id -u)" -ne 0 ]]; then
    echo "bench/run.sh: --pgbench needs root (bench/pgbench.sh mounts ext4 on loop devices)" >&2
    exit 2
fi

# fio, nbdkit, qemu-utils, fuse3, curl; and versitygw (built with Go on first use).
bash scripts/install-test-deps.sh >/dev/null
if [[ -n "$s3" ]]; then
    bash scripts/install-bench-deps.sh s3backer
fi
cargo build --release --locked -p lsvd >/dev/null
lsvd="${CARGO_TARGET_DIR:-target}/release/lsvd"
if [[ -n "$tls" ]]; then
    bench/tls.sh --lsvd "$lsvd"
fi

if [[ -n "$s3" ]]; then
    scripts/with-versitygw.sh python3 bench/bench.py --lsvd "$lsvd" --s3 ${args[@]+"${args[@]}"}
else
    python3 bench/bench.py --lsvd "$lsvd" ${args[@]+"${args[@]}"}
fi
if [[ -n "$pgbench" ]]; then
    bench/pgbench.sh --lsvd "$lsvd" ${pgbench_args[@]+"${pgbench_args[@]}"}
fi

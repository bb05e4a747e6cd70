#!/usr/bin/env bash
# Benchmark lsvd against its peers on this machine, in one run.
#
#   bench/run.sh [--quick] [--no-s3] [--tls] [--out DIR] [--dir SCRATCH]
#
# Targets: fio on a raw file (the device), nbdkit memory (the NBD ceiling), qemu-nbd on
# a raw file, lsvd on the local store, lsvd on versitygw and s3backer on versitygw (an
# S3 server on loopback, started for the run by scripts/with-versitygw.sh; --no-s3
# leaves those two out). Jobs: 4 KiB random write QD32, 4 KiB random read QD32
# (written volume), 1 MiB sequential write, 4 KiB write+fsync QD1, 70/30 random mix
# QD32, 4 KiB random write over 4 connections at QD8 each. Writes a markdown table, JSON and an SVG chart to the output dir
# (bench/results by default). --tls first runs bench/tls.sh (4 KiB random write IOPS
# over loopback TCP, plain vs NBD over TLS, median of 3). Not part of CI: numbers on a shared 2-core machine are
# noisy; read the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."

s3=1
tls=""
args=()
for a in "$@"; do
    case "$a" in
        --no-s3) s3="" ;;
        --tls) tls=1 ;;
        --s3) ;; # the default; accepted for old command lines
        *) args+=("$a") ;;
    esac
done

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    local sudo=()
    [[ "$(id -u)" -eq 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@"
}

# fio, nbdkit, qemu-utils, fuse3, curl; and versitygw (built with Go on first use).
bash scripts/install-test-deps.sh >/dev/null
if [[ -n "$s3" ]] && ! command -v s3backer >/dev/null; then
    apt_install s3backer
fi
cargo build --release --locked -p lsvd >/dev/null
lsvd="${CARGO_TARGET_DIR:-target}/release/lsvd"
if [[ -n "$tls" ]]; then
    bench/tls.sh --lsvd "$lsvd"
fi

if [[ -n "$s3" ]]; then
    exec scripts/with-versitygw.sh python3 bench/bench.py --lsvd "$lsvd" --s3 "${args[@]}"
fi
exec python3 bench/bench.py --lsvd "$lsvd" "${args[@]}"

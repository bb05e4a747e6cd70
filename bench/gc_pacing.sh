#!/usr/bin/env bash
# GC pacing: p50/p99/p99.9 of 4 KiB random writes at QD1 and a fixed rate, with GC off
# and with GC collecting the whole time, on one volume in one run (bench/gc_pacing.py).
#
#   bench/gc_pacing.sh [--size 1G] [--rate 1000] [--runtime 40] [--rounds 5] [--out DIR] [--dir SCRATCH]
#                      [--serve-arg=ARG ...]
#
# Writes DIR/gc_pacing.{md,json} (default bench/results). About 9 minutes with the
# defaults. Not part of CI: numbers on a shared 2-core machine are noisy.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v fio >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio; }
cargo build --release -p lsvd >/dev/null
exec python3 bench/gc_pacing.py --lsvd "${CARGO_TARGET_DIR:-target}/release/lsvd" "$@"

#!/usr/bin/env bash
# Benchmark lsvd against its peers on this machine, in one run.
#
#   bench/run.sh [--quick] [--s3] [--out DIR]
#
# Targets: fio on a raw file (the device), nbdkit memory (the NBD ceiling), qemu-nbd on
# a raw file, lsvd on the local store, and with --s3 lsvd on versitygw (and s3backer on
# versitygw when s3backer is installed). Jobs: 4 KiB random write QD32, 4 KiB random
# read QD32 (written volume), 1 MiB sequential write, 4 KiB write+fdatasync QD1, 70/30
# random mix QD32. Writes a markdown table, JSON and an SVG chart to the output dir.
# Not part of CI: numbers on a shared 2-core machine are noisy; read the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh >/dev/null
command -v qemu-nbd >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-utils; }
command -v nbdkit >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nbdkit; }
cargo build --release -p lsvd >/dev/null
exec python3 bench/bench.py --lsvd target/release/lsvd "$@"

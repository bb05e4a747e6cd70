#!/bin/sh
# Reproduces every number and the chart in docs/sim/crossover.md (seconds to run).
# Run from the repository root after `cargo build --release`:
#   LSVD=target/release/lsvd sh docs/sim/crossover.sh
set -eu
LSVD=${LSVD:-target/release/lsvd}
OUT=docs/sim/out
mkdir -p "$OUT"

# 1. The crossover experiment: uniform 8 KiB updates, disk utilization 0.5 to 0.98,
#    1991 and 2003 disks, analytical cleaning utilization.
"$LSVD" sim --layout overwrite,lfs,hylog --disk 1991,2003 --synthetic uniform \
    --io-size 8K --utilization 0.5..0.98 --plot docs/sim/crossover.svg \
    > "$OUT/crossover.txt"

# 2. The same with LFS's cleaning utilization measured with lsvd's greedy GC (64 MiB
#    volume, 1 MiB objects, one segment per GC pass).
"$LSVD" sim --layout overwrite,lfs,hylog --disk 1991,2003 --synthetic uniform \
    --io-size 8K --utilization 0.5..0.98 --cleaning sim > "$OUT/crossover-sim.txt"

# 3. The 1999 disk (HyLog's table has it; the sweep does not) and the segment
#    size's effect on the 1991 crossover.
"$LSVD" sim --layout overwrite,lfs,hylog --disk 1999 --synthetic uniform --io-size 8K \
    --utilization 0.9..0.98:0.02 --cleaning sim > "$OUT/crossover-1999.txt"
for seg in 256K 512K 4M 64M; do
    echo "== --segment-size $seg"
    "$LSVD" sim --layout overwrite,lfs --disk 1991,2003 --synthetic uniform \
        --io-size 8K --segment-size "$seg" --utilization 0.74
done > "$OUT/crossover-segment-size.txt"

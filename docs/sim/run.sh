#!/bin/sh
# Reproduces every number and chart in docs/sim/README.md.
# Run from the repository root after `cargo build --release`:
#   LSVD=target/release/lsvd TRACES=../shared/traces sh docs/sim/run.sh
# Outputs go to docs/sim/out/ (text tables) and docs/sim/*.svg (charts).
set -eu
LSVD=${LSVD:-target/release/lsvd}
T=${TRACES:-../shared/traces}
OUT=docs/sim/out
mkdir -p "$OUT"

TRACE_FILES="$T/msr_hm0_head1k/msr-cambridge1-sample.csv
$T/msr_heimdall_cuts10k/msr.cut.per_10k.rw_20_80.105.trace
$T/msr_heimdall_cuts10k/msr.cut.per_10k.rw_40_60.1370.trace
$T/msr_heimdall_cuts10k/msr.cut.per_10k.most_thpt_rand_iops.1006.trace
$T/ms_tpcc_mqsim/tpcc-small.trace
$T/umass_financial1_head10k/example.ascii
$T/cloudphysics_libcachesim/cloudPhysicsIO.csv
$T/tencent_cbs_sample50k/cloud_storage-sample.bz2
$T/systor17_sample/systor17-traces-sample.csv.gz
$T/systor17_sample/systor17-additional-sample.csv.gz"

# 1. Shared traces with the engine's defaults: 8 MiB batches closed after 2 s of trace
#    time, a checkpoint every 64 objects, greedy GC between 70% and 75% utilization.
#    (The TPC-C file is DiskSim-style ASCII; auto-detection reads it as such.)
# shellcheck disable=SC2086
"$LSVD" sim $TRACE_FILES > "$OUT/traces-default.txt"

# 2. The same traces with the LSVD paper's simulation settings: 32 MiB batches, no
#    timeout (batches close only when full or at the end).
# shellcheck disable=SC2086
"$LSVD" sim $TRACE_FILES --batch-size 32M --batch-timeout-ms 0 > "$OUT/traces-paper.txt"

# 3. CloudPhysics: batch size and timeout, with a chart.
"$LSVD" sim "$T/cloudphysics_libcachesim/cloudPhysicsIO.csv" --batch-size 1M,8M,32M \
    --plot docs/sim/cloudphysics.svg > "$OUT/cloudphysics-batch.txt"
"$LSVD" sim "$T/cloudphysics_libcachesim/cloudPhysicsIO.csv" --batch-size 1M,8M,32M \
    --batch-timeout-ms 0 > "$OUT/cloudphysics-batch-no-timeout.txt"

# 4. Synthetic, 1 GiB volume filled sequentially, then 4M random 4 KiB writes
#    (16 volume-writes): GC thresholds x victim policy, 8 MiB batches.
for p in uniform hotcold:0.2:0.8 hotcold:0.1:0.9; do
    name=$(echo "$p" | tr ':' '-')
    "$LSVD" sim --synthetic "$p" --volume-size 1G --requests 4000000 --precondition \
        --gc-start 0.6,0.7,0.8 --gc-policy greedy,cost-benefit --preload \
        > "$OUT/synthetic-$name-gc.txt"
done

# 5. Synthetic: batch (object) size, greedy at 70-75%.
for p in uniform hotcold:0.1:0.9; do
    name=$(echo "$p" | tr ':' '-')
    "$LSVD" sim --synthetic "$p" --volume-size 1G --requests 4000000 --precondition \
        --batch-size 1M,8M,32M --preload > "$OUT/synthetic-$name-batch.txt"
done

# 6. Charts: greedy vs cost-benefit on 90/10 hot/cold, and uniform at three thresholds.
"$LSVD" sim --synthetic hotcold:0.1:0.9 --volume-size 1G --requests 4000000 --precondition \
    --gc-policy greedy,cost-benefit --plot docs/sim/hotcold-90-10.svg > /dev/null
"$LSVD" sim --synthetic uniform --volume-size 1G --requests 4000000 --precondition \
    --gc-start 0.6,0.7,0.8 --plot docs/sim/uniform-thresholds.svg > /dev/null

# 7. Speed (requests per CPU second of the replay thread; --preload leaves parsing out).
{
    "$LSVD" sim "$T/cloudphysics_libcachesim/cloudPhysicsIO.csv" | tail -n 1
    "$LSVD" sim "$T/cloudphysics_libcachesim/cloudPhysicsIO.csv" --preload | tail -n 1
    for p in uniform hotcold:0.2:0.8 zipf:0.99 sequential; do
        printf '%s: ' "$p"
        "$LSVD" sim --synthetic "$p" --volume-size 1G --requests 10000000 --precondition \
            --preload | tail -n 1
    done
} > "$OUT/speed.txt"

# 8. Defragmenting GC (the LSVD paper's Table 5 "defrag" column): gaps of up to 4K, 8K
#    and 16K plugged, against none. The CloudPhysics sample is too short for GC to
#    start at 0.70, so it runs with GC from 0.90.
{
    "$LSVD" sim "$T/cloudphysics_libcachesim/cloudPhysicsIO.csv" --batch-size 8M \
        --batch-timeout-ms 0 --gc-start 0.9 --gc-defrag 0,8K
    for p in uniform hotcold:0.2:0.8 hotcold:0.1:0.9 zipf:0.99; do
        "$LSVD" sim --synthetic "$p" --volume-size 1G --requests 3000000 --precondition \
            --preload --gc-defrag 0,4K,8K,16K
    done
} > "$OUT/defrag.txt"

#!/bin/sh
# Reproduces every number and the chart in docs/sim/gecko.md (about a minute).
# Run from the repository root after `cargo build --release` (or any build of lsvd):
#   LSVD=target/release/lsvd sh docs/sim/gecko.sh
set -eu
LSVD=${LSVD:-target/release/lsvd}
OUT=docs/sim/out
mkdir -p "$OUT"

# Gecko's disk: a 10K rpm WD 2.5" SATA drive (4.2 ms average seek, 3 ms half
# rotation); 120 MB/s is the sequential rate Gecko's tail drive reached.
PAPER_HDD=hdd:seek_ms=4.2,rpm=10000,mb_per_s=120
# The 2-drive experiment: 8 GiB drives, 1 MiB segments, the address space (49% of
# both drives) written once so that drive 0 is full and the chain's tail soon moves
# to drive 1; 4 clients x 8 outstanding 4 KiB random writes; GC from 28% free
# segments (about 30 s into the chain's run, as in Gecko's Figures 3 and 5).
COMMON="--drive-size 8G --segment-size 1M --fill 0.49 --gc-free-start 0.28 \
    --gc-free-stop 0.33 --clients 4 --queue-depth 8 --seconds 60 --interval-ms 1000"

# 1. The three configurations on Gecko's disk, Gecko's cleaner order (log order):
#    the chart and the main table.
"$LSVD" sim --layout chain:2,stripe:2 --chain-gc compact-in-body,move-to-tail \
    --device "$PAPER_HDD" --gc-policy log-order $COMMON \
    --plot docs/sim/gecko-2hdd.svg > "$OUT/gecko-2hdd.txt"
"$LSVD" sim --layout chain:2,stripe:2 --chain-gc compact-in-body,move-to-tail \
    --device "$PAPER_HDD" --gc-policy log-order $COMMON --json > "$OUT/gecko-2hdd.json"

# 2. The same with greedy victims (lsvd's default order).
"$LSVD" sim --layout chain:2,stripe:2 --chain-gc compact-in-body,move-to-tail \
    --device "$PAPER_HDD" --gc-policy greedy $COMMON > "$OUT/gecko-2hdd-greedy.txt"

# 3. The default 7200 rpm disk (8.5 ms seek, 150 MB/s).
"$LSVD" sim --layout chain:2,stripe:2 --chain-gc compact-in-body,move-to-tail \
    --device hdd --gc-policy log-order $COMMON > "$OUT/gecko-2hdd-7200.txt"

# 4. Past the tail: 2 GiB drives for 120 s, so the tail fills several times and the
#    clients write only as fast as GC frees segments (the steady state).
"$LSVD" sim --layout chain:2,stripe:2 --chain-gc compact-in-body,move-to-tail \
    --device "$PAPER_HDD" --gc-policy log-order --drive-size 2G --segment-size 1M \
    --fill 0.49 --gc-free-start 0.28 --gc-free-stop 0.33 --seconds 120 \
    --interval-ms 5000 --plot docs/sim/gecko-2hdd-steady.svg > "$OUT/gecko-2hdd-steady.txt"

# 5. Segment size: 256 KiB and 8 MiB segments (victim reads amortize positioning).
for seg in 256K 8M; do
    echo "== --segment-size $seg"
    "$LSVD" sim --layout chain:2,stripe:2 --chain-gc compact-in-body,move-to-tail \
        --device "$PAPER_HDD" --gc-policy log-order --drive-size 8G --segment-size "$seg" \
        --stripe-unit 64K --fill 0.49 --gc-free-start 0.28 --gc-free-stop 0.33 \
        --seconds 60 --interval-ms 1000 | sed -n '1,6p'
done > "$OUT/gecko-2hdd-segment-size.txt"

# 6. SATA SSDs instead of disks (no positioning: the chain only loses bandwidth).
"$LSVD" sim --layout chain:2,stripe:2 --chain-gc compact-in-body,move-to-tail \
    --device ssd --gc-policy log-order $COMMON | sed -n '1,6p' > "$OUT/gecko-2ssd.txt"

# 7. The trace mix: the three MSR 10k-request cuts and the hm_0 sample interleaved
#    (round robin), each in its own address range, replayed closed-loop; a chain of 3
#    against a log striped over 6 drives (no mirrors, no caches). The mix touches
#    185 MiB: with 192 MiB drives it fills the chain's drive 0, so the tail moves to
#    drive 1 at once (with 1 GiB drives tail and data would share drive 0).
TRACES=${TRACES:-../shared/traces}
"$LSVD" sim --layout chain:3,stripe:6 --chain-gc compact-in-body,move-to-tail \
    --device "$PAPER_HDD" --gc-policy log-order --drive-size 192M --segment-size 3M \
    --stripe-unit 64K --seconds 600 --interval-ms 10000 \
    "$TRACES"/msr_heimdall_cuts10k/*.trace "$TRACES"/msr_hm0_head1k/msr-cambridge1-sample.csv \
    | sed -n '1,8p' > "$OUT/gecko-trace-mix.txt"

# 8. The trace mix with a tail cache (an LRU of client-written 4 KiB blocks; a read
#    hit touches no drive) and mirrored layouts (chain:3x2: 3 positions of 2 drives,
#    writes to both, reads from the less busy; stripe:3x2 is Gecko's RAID-10
#    baseline). 32 MiB is Gecko's tail cache scaled to this mix: 34 GB (2 GB RAM +
#    32 GB SSD) for 200 GB of prefilled data is 17%, and 17% of the 185 MiB touched
#    here is 32 MiB. Every layout gets the same cache. Then the same without a cache
#    and with 8, 128 and 256 MiB (more than the mix writes: every written block
#    stays), to show how much the size matters.
MIX="--chain-gc compact-in-body --device $PAPER_HDD --gc-policy log-order \
    --drive-size 192M --segment-size 3M --stripe-unit 64K --seconds 600 --interval-ms 10000 \
    $TRACES/msr_heimdall_cuts10k/*.trace $TRACES/msr_hm0_head1k/msr-cambridge1-sample.csv"
for cache in 32M 0 8M 128M 256M; do
    echo "== --tail-cache $cache"
    # shellcheck disable=SC2086
    "$LSVD" sim --layout chain:3,chain:3x2,stripe:3x2,stripe:6 --tail-cache "$cache" $MIX \
        | sed '/^$/q'
done > "$OUT/gecko-trace-mix-cache.txt"
# shellcheck disable=SC2086
"$LSVD" sim --layout chain:3,chain:3x2,stripe:3x2,stripe:6 --tail-cache 32M $MIX --json \
    | python3 -c 'import json,sys
for r in json.load(sys.stdin)["runs"]:
    print(r["name"], "drive busy:", " ".join("%.2f" % b for b in r["summary"]["drive_busy_fraction"]))' \
    >> "$OUT/gecko-trace-mix-cache.txt"

#!/bin/sh
# Reproduces every number and chart in docs/sim/hylog-traces.md: greedy, cost-benefit
# and hylog GC on the shared real-trace samples, three GC bands each.
# Run from the repository root after `cargo build --release -p lsvd`:
#   LSVD=target/release/lsvd TRACES=../shared/traces sh docs/sim/hylog-traces.sh
# Outputs: docs/sim/out/hylog-traces-*.json (one per trace, every configuration),
# docs/sim/out/hylog-traces-table.md (the table), -survey.txt, -time.txt, and
# docs/sim/hylog-*.svg (charts). OUT=DIR writes the outputs elsewhere, CHARTS=0 skips
# the charts (for a variant binary: hylog-traces.md, "Why").
#
# Method (the same for every trace; see hylog-traces.md for why):
# - the trace is replayed LOOPS times back to back (its lines concatenated into a
#   temporary file; a CSV header is kept once), so every block it writes is
#   overwritten at least LOOPS-1 times and GC has work;
# - one volume per trace: the one with the most write requests (single-volume traces:
#   their volume);
# - the object (batch) size is scaled to that volume's footprint F (the live bytes
#   after one pass of the trace): the largest power of two <= F/32, at least 4 KiB,
#   so the volume spans about 32 objects like the 256 MiB / 8 MiB synthetic runs of
#   hylog.md; a GC pass moves at most 4 objects' worth (the engine's 32M : 8M);
# - batches close only when full (--batch-timeout-ms 0): trace time plays no role, so
#   the loop's jump back in time changes nothing;
# - GC bands 0.70/0.75, 0.80/0.85, 0.90/0.93, policies greedy, cost-benefit, hylog
#   (9 configurations, one replay).
set -eu
LSVD=${LSVD:-target/release/lsvd}
T=${TRACES:-../shared/traces}
LOOPS=${LOOPS:-10}
OUT=${OUT:-docs/sim/out}
CHARTS=${CHARTS:-1}
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM

# loop SRC DST: SRC (plain, .gz or .bz2) concatenated LOOPS times into DST, a first
# line that does not start with a digit (a CSV header) kept only once.
loop() {
    case "$1" in
    *.gz) cat_cmd="gzip -dc" ;;
    *.bz2) cat_cmd="bzip2 -dc" ;;
    *) cat_cmd="cat" ;;
    esac
    $cat_cmd "$1" > "$TMP/one"
    : > "$2"
    i=0
    while [ "$i" -lt "$LOOPS" ]; do
        if [ "$i" -eq 0 ]; then
            cat "$TMP/one" >> "$2"
        else
            awk 'NR > 1 || $0 ~ /^[0-9]/' "$TMP/one" >> "$2"
        fi
        i=$((i + 1))
    done
}

# name | file | format | volume | batch size. The volume and batch size come from the
# survey below (one pass, GC off): the volume with the most write requests, and the
# largest power of two <= its live bytes / 32 (at least 4K).
TRACES_TABLE="msr-hm0|msr_hm0_head1k/msr-cambridge1-sample.csv|msr|hm_0|32K
msr-rw20-80|msr_heimdall_cuts10k/msr.cut.per_10k.rw_20_80.105.trace|msr-cut|dev0|512K
msr-rw40-60|msr_heimdall_cuts10k/msr.cut.per_10k.rw_40_60.1370.trace|msr-cut|dev0|512K
msr-thpt-rand|msr_heimdall_cuts10k/msr.cut.per_10k.most_thpt_rand_iops.1006.trace|msr-cut|dev0|2M
tpcc|ms_tpcc_mqsim/tpcc-small.trace|disksim|dev15|32K
umass-fin1|umass_financial1_head10k/example.ascii|spc|asu0|128K
cloudphysics|cloudphysics_libcachesim/cloudPhysicsIO.csv|cloudphysics|vol0|16M
tencent|tencent_cbs_sample50k/cloud_storage-sample.bz2|tencent|vol6378|128K
systor17|systor17_sample/systor17-traces-sample.csv.gz|systor|lun0|64K
systor17-add|systor17_sample/systor17-additional-sample.csv.gz|systor|lun0|64K"

field() { echo "$1" | cut -d'|' -f"$2"; }

# 1. Survey: per trace, the three volumes with the most write requests, bytes written
#    and live bytes after one pass (GC off).
for row in $TRACES_TABLE; do
    printf '%s: ' "$(field "$row" 1)"
    "$LSVD" sim "$T/$(field "$row" 2)" --gc-start 0 --batch-timeout-ms 0 --json |
        jq -r '[.volumes | sort_by(-.write_requests) | .[:3][] |
            "\(.volume) \(.write_requests) writes, \(.client_write_bytes / 10485.76 | round / 100) MiB written, \(.live_bytes / 10485.76 | round / 100) MiB live"] | join("; ")'
done > "$OUT/hylog-traces-survey.txt"

# 2. Every trace, looped, 3 policies x 3 GC bands in one replay. The JSON (without
#    the series) goes to out/; wall time per trace to out/hylog-traces-time.txt.
: > "$OUT/hylog-traces-time.txt"
for row in $TRACES_TABLE; do
    name=$(field "$row" 1)
    batch=$(field "$row" 5)
    loop "$T/$(field "$row" 2)" "$TMP/trace"
    # A GC pass of at most 4 objects: 32K -> 128K, 16M -> 64M.
    pass=$(($(echo "$batch" | tr -d 'KM') * 4))$(echo "$batch" | tr -d '0-9')
    t0=$(date +%s)
    "$LSVD" sim "$TMP/trace" --format "$(field "$row" 3)" --volume "$(field "$row" 4)" \
        --batch-size "$batch" --gc-pass "$pass" --batch-timeout-ms 0 \
        --gc-start 0.7,0.8,0.9 --gc-stop 0.75,0.85,0.93 \
        --gc-policy greedy,cost-benefit,hylog --json --series > "$TMP/$name.json"
    t1=$(date +%s)
    echo "$name $((t1 - t0)) s" >> "$OUT/hylog-traces-time.txt"
    jq --arg f "$(field "$row" 2) x $LOOPS" '.volumes[].series = [] | .inputs[].name = $f' \
        "$TMP/$name.json" > "$OUT/hylog-traces-$name.json"
done

# 3. The table: per trace and band, WAF (GC moved) per policy, hylog against the better
#    of greedy and cost-benefit, hylog's mean hot fraction and separating passes.
{
    echo "| trace | GC band | greedy WAF (GC moved) | cost-benefit | hylog | hylog vs better | hot fraction (mean) | passes separated | hylog moved hot / cold |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    for row in $TRACES_TABLE; do
        name=$(field "$row" 1)
        jq -r --arg name "$name" '
            def mib: . / 1048576 | if . >= 1024 then "\(. / 1024 * 10 | round / 10) GiB"
                else "\(. * 10 | round / 10) MiB" end;
            def w: .write_amplification * 1000 | round / 1000 | tostring
                | if test("\\.") then . + "000" | .[0:(index(".") + 4)] else . + ".000" end;
            .volumes | group_by(.gc_start)[] |
            (map(select(.gc_policy == "greedy"))[0]) as $g |
            (map(select(.gc_policy == "cost-benefit"))[0]) as $c |
            (map(select(.gc_policy == "hylog"))[0]) as $h |
            ([$g.write_amplification, $c.write_amplification] | min) as $best |
            (($h.write_amplification / $best - 1) * 1000 | round / 10) as $d |
            "| \($name) | \($g.gc_start * 100 | round / 100)/\($g.gc_stop * 100 | round / 100) | \($g | w) (\($g.gc_bytes_moved | mib)) | \($c | w) (\($c.gc_bytes_moved | mib)) | \($h | w) (\($h.gc_bytes_moved | mib)) | \(if $d > 0 then "+" else "" end)\($d)% | \($h.gc_hot_fraction_mean * 1000 | round / 1000) | \($h.gc_separating_passes)/\($h.gc_passes) | \($h.gc_hot_bytes_moved | mib) / \($h.gc_cold_bytes_moved | mib) |"
        ' "$OUT/hylog-traces-$name.json"
    done
} > "$OUT/hylog-traces-table.md"

# 4. Charts: greedy, cost-benefit and hylog at 0.80/0.85, with the hot fraction hylog
#    chose over time (the fourth panel).
[ "$CHARTS" = 0 ] && exit 0
for row in $TRACES_TABLE; do
    name=$(field "$row" 1)
    case "$name" in cloudphysics | msr-rw20-80 | msr-hm0 | systor17-add) ;; *) continue ;; esac
    batch=$(field "$row" 5)
    loop "$T/$(field "$row" 2)" "$TMP/trace"
    pass=$(($(echo "$batch" | tr -d 'KM') * 4))$(echo "$batch" | tr -d '0-9')
    "$LSVD" sim "$TMP/trace" --format "$(field "$row" 3)" --volume "$(field "$row" 4)" \
        --batch-size "$batch" --gc-pass "$pass" --batch-timeout-ms 0 \
        --gc-start 0.8 --gc-stop 0.85 --gc-policy greedy,cost-benefit,hylog \
        --plot "docs/sim/hylog-$name.svg" > /dev/null
done

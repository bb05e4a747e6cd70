#!/usr/bin/env bash
# Gecko's experiment live (issue 15): `lsvd serve` over a chain of 2 emulated drives
# (compact-in-body, move-to-tail) and over a stripe of the same 2 drives, under fio 4 KiB
# random writes, with GC starting partway. Reports fio's write MB/s before GC started
# and while it ran (medians of fio's per-second samples) and GC's MB/s. See gecko.md,
# "Live, on throttled drives".
#
# Each drive is nbdkit's memory plugin behind three filters, so that it serves one
# request at a time (noparallel serialize=all-requests), cut into pieces of at most
# PIECE bytes (blocksize maxdata), each piece taking PIECE_MS (delay): about
# PIECE / PIECE_MS of bandwidth shared by reads and writes, and a request of any size
# costs at least PIECE_MS. nbdfuse shows it as a file, losetup makes that a block
# device, and ext4 on it is the directory the store uses. Nothing is attached to the
# kernel's NBD client: fio talks to lsvd with its nbd engine.
#
# Usage (root; installs nbdkit, libnbd-bin, fio, fuse3, e2fsprogs, curl, python3 if
# missing):
#   cargo build --release -p lsvd
#   LSVD=target/release/lsvd bash docs/sim/gecko-live.sh
# Environment: LSVD (required), OUT (docs/sim/out), LAYOUTS (stripe move-to-tail
# compact-in-body), VOLUME (768M), DRIVE_DEV (1088M: each drive's block device),
# DRIVE_SIZE (864M: the chain's drive_size), PIECE (24k), PIECE_MS (1), LOG_SIZE (64M),
# RUN_SECONDS (75: the random-write phase), IODEPTH (32), SERVE_ARGS (more `lsvd serve`
# flags, e.g. "--gc-rate 0"; --gc-headroom 0 unless they name one), NAME (gecko-live: the prefix of the output files).
set -eu

: "${LSVD:?set LSVD to the lsvd binary (cargo build --release -p lsvd)}"
LSVD="$(cd "$(dirname "$LSVD")" && pwd)/$(basename "$LSVD")"
here="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$here/out}"
LAYOUTS="${LAYOUTS:-stripe move-to-tail compact-in-body}"
VOLUME="${VOLUME:-768M}"
DRIVE_DEV="${DRIVE_DEV:-1088M}"
DRIVE_SIZE="${DRIVE_SIZE:-864M}"
PIECE="${PIECE:-24k}"
PIECE_MS="${PIECE_MS:-1}"
LOG_SIZE="${LOG_SIZE:-64M}"
RUN_SECONDS="${RUN_SECONDS:-75}"
IODEPTH="${IODEPTH:-32}"
SERVE_ARGS="${SERVE_ARGS:-}"
# The runs in gecko.md were made when clients waited for GC as soon as it fell behind
# (no headroom); `lsvd serve` now defaults to a headroom of a quarter of the log, so say 0
# unless SERVE_ARGS picks one.
case " $SERVE_ARGS " in
    *" --gc-headroom "*) ;;
    *) SERVE_ARGS="--gc-headroom 0 $SERVE_ARGS" ;;
esac
NAME="${NAME:-gecko-live}"
DRIVES=2

export PATH="/usr/bin:/usr/sbin:/bin:/sbin:$PATH"

# --- tools -------------------------------------------------------------------------
need=""
for pair in nbdkit:nbdkit nbdfuse:libnbd-bin fio:fio fusermount3:fuse3 \
    mkfs.ext4:e2fsprogs losetup:mount curl:curl python3:python3; do
    command -v "${pair%%:*}" > /dev/null 2>&1 || need="$need ${pair#*:}"
done
if [ -n "$need" ]; then
    echo "gecko-live: installing$need"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    # shellcheck disable=SC2086 # the package list is meant to split
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need
fi
fio --enghelp 2> /dev/null | grep -qw nbd || {
    echo "gecko-live: this fio has no nbd engine" >&2
    exit 1
}
[ "$(id -u)" -eq 0 ] || {
    echo "gecko-live: needs root (losetup, mount)" >&2
    exit 1
}

# --- cleanup -------------------------------------------------------------------------
work="$(mktemp -d /tmp/gecko-live.XXXXXX)"
bg_pids=""    # sampler, evictor, fio, lsvd: ours, killed by id
lsvd_pid=""

alive() { # pid: running (not gone, not a zombie)
    [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2> /dev/null)" != Z ]
}

stop_pid() { # pid signal: signal, wait up to 60 s, then KILL
    kill "-$2" "$1" 2> /dev/null || return 0
    for _ in $(seq 600); do
        alive "$1" || return 0
        sleep 0.1
    done
    kill -KILL "$1" 2> /dev/null || true
}

drives_down() {
    for i in $(seq 0 $((DRIVES - 1))); do
        d="$work/drive$i"
        [ -d "$d" ] || continue
        mountpoint -q "$d/mnt" && umount "$d/mnt"
        [ -s "$d/loopdev" ] && losetup -d "$(cat "$d/loopdev")" 2> /dev/null
        rm -f "$d/loopdev"
        mountpoint -q "$d/fuse" && fusermount3 -u "$d/fuse"
        if [ -s "$d/nbdfuse.pid" ]; then
            stop_pid "$(cat "$d/nbdfuse.pid")" TERM
        fi
        if [ -s "$d/nbdkit.pid" ]; then
            stop_pid "$(cat "$d/nbdkit.pid")" TERM
        fi
        rm -rf "$d"
    done
}

cleanup() {
    set +e
    for p in $bg_pids; do stop_pid "$p" TERM; done
    [ -n "$lsvd_pid" ] && stop_pid "$lsvd_pid" INT
    drives_down
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for() { # tries command...: poll every 0.1 s
    n="$1"
    shift
    for _ in $(seq "$n"); do
        "$@" > /dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "gecko-live: timed out waiting for: $*" >&2
    return 1
}

# --- the drives ----------------------------------------------------------------------
drives_up() {
    for i in $(seq 0 $((DRIVES - 1))); do
        d="$work/drive$i"
        mkdir -p "$d/fuse" "$d/mnt"
        nbdkit -U "$d/sock" -P "$d/nbdkit.pid" \
            --filter=blocksize --filter=noparallel --filter=delay \
            memory size="$DRIVE_DEV" maxdata="$PIECE" serialize=all-requests \
            delay-read="${PIECE_MS}ms" delay-write="${PIECE_MS}ms"
        wait_for 100 test -S "$d/sock"
        nbdfuse -P "$d/nbdfuse.pid" "$d/fuse/drive" --unix "$d/sock" &
        wait_for 100 test -s "$d/nbdfuse.pid"
        losetup --direct-io=on -f --show "$d/fuse/drive" > "$d/loopdev"
        # Inode tables and journal written now, not by ext4lazyinit during the run.
        mkfs.ext4 -q -T largefile4 -E lazy_itable_init=0,lazy_journal_init=0,nodiscard \
            "$(cat "$d/loopdev")"
        mount "$(cat "$d/loopdev")" "$d/mnt"
        mkdir "$d/mnt/store"
    done
}

calibrate() { # one line per drive: dd direct write and read of 32 MiB
    for i in $(seq 0 $((DRIVES - 1))); do
        f="$work/drive$i/mnt/calibrate"
        w="$(dd if=/dev/zero of="$f" bs=1M count=32 oflag=direct 2>&1 | tail -1)"
        r="$(dd if="$f" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1)"
        rm -f "$f"
        echo "drive$i write: $w"
        echo "drive$i read:  $r"
    done
}

# --- samplers --------------------------------------------------------------------------
# One line a second: time, the volume's GC and store counters, each drive's block-layer
# bytes read and written and busy time, the machine's busy and total CPU jiffies, and the CPU jiffies
# of lsvd and of the drives' nbdkit and nbdfuse processes.
sampler() { # metrics_url out_file lsvd_pid
    loops=""
    stack=""
    for i in $(seq 0 $((DRIVES - 1))); do
        loops="$loops $(basename "$(cat "$work/drive$i/loopdev")")"
        stack="$stack /proc/$(cat "$work/drive$i/nbdkit.pid")/stat"
        stack="$stack /proc/$(cat "$work/drive$i/nbdfuse.pid")/stat"
    done
    {
        printf 'epoch_ms gc_moved_bytes gc_pass_in_flight gc_passes store_write_bytes'
        printf ' client_write_bytes uploads_held uploads_pending log_used_bytes utilization'
        printf ' store_bytes tail_drive'
        for i in $(seq 0 $((DRIVES - 1))); do
            printf ' d%s_read_bytes d%s_write_bytes d%s_busy_ms' "$i" "$i" "$i"
        done
        printf ' cpu_busy cpu_total lsvd_cpu drives_cpu\n'
    } > "$2"
    while :; do
        now="$(date +%s%3N)"
        m="$(curl -s --max-time 1 "$1" || true)"
        line="$now"
        for k in gc_moved_bytes_total gc_pass_in_flight gc_passes_total \
            store_write_bytes_total client_write_bytes_total uploads_held uploads_pending \
            log_used_bytes utilization store_bytes store_tail_drive; do
            v="$(printf '%s\n' "$m" | awk -v k="lsvd_$k" '$1 ~ "^"k"([{]|$)" {print $2; exit}')"
            line="$line ${v:-NA}"
        done
        for l in $loops; do
            # sectors read, sectors written, ms with a request in flight
            line="$line $(awk '{print $3 * 512, $7 * 512, $10}' "/sys/block/$l/stat")"
        done
        line="$line $(awk '/^cpu / {print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat)"
        line="$line $(awk '{print $14 + $15}' "/proc/$3/stat")"
        # shellcheck disable=SC2086 # one path per process
        line="$line $(awk '{s += $14 + $15} END {print s}' $stack)"
        echo "$line" >> "$2"
        sleep 1
    done
}

# The drives' contents live in this machine's page cache too, so GC's reads of objects
# written minutes earlier would never reach a drive. Real drives hold far more than RAM;
# to make reads reach them, drop the cached pages of every object file each 0.5 s
# (POSIX_FADV_DONTNEED drops clean pages only; lsvd fsyncs each object it writes).
evictor() { # dirs...
    exec python3 - "$@" << 'EOF'
import os, sys, time
while True:
    for top in sys.argv[1:]:
        for root, _, files in os.walk(top):
            for name in files:
                try:
                    fd = os.open(os.path.join(root, name), os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    time.sleep(0.5)
EOF
}

metric() { # url name: the value of lsvd_NAME
    curl -s --max-time 2 "$1" | awk -v k="lsvd_$2" '$1 ~ "^"k"([{]|$)" {print $2; exit}'
}

drained() { # url: nothing in the write log or waiting for upload, no GC pass
    [ "$(metric "$1" log_used_bytes)" = 0 ] && [ "$(metric "$1" uploads_pending)" = 0 ] &&
        [ "$(metric "$1" gc_pass_in_flight)" = 0 ]
}

# --- one layout -------------------------------------------------------------------------
run_layout() { # layout
    layout="$1"
    dirs=""
    for i in $(seq 0 $((DRIVES - 1))); do dirs="$dirs${dirs:+,}$work/drive$i/mnt/store"; done
    case "$layout" in
        stripe) store="stripe:$dirs" ;;
        move-to-tail | compact-in-body) store="chain:$dirs?drive_size=$DRIVE_SIZE&gc=$layout" ;;
        *)
            echo "gecko-live: unknown layout $layout" >&2
            exit 2
            ;;
    esac
    echo "gecko-live: $layout: drives up"
    drives_up
    pre="$OUT/$NAME-$layout"
    {
        echo "layout: $layout"
        echo "store: $store"
        calibrate
    } > "$pre-drives.txt"
    cat "$pre-drives.txt"

    data="$work/data"
    rm -rf "$data"
    mkdir -p "$data"
    port="$(free_port)"
    mport="$(free_port)"
    "$LSVD" create --data "$data" --store "$store" --size "$VOLUME" disk0
    # shellcheck disable=SC2086 # SERVE_ARGS is a list of flags
    LSVD_LOG=info "$LSVD" serve disk0 --data "$data" --store "$store" \
        --listen "127.0.0.1:$port" --metrics "127.0.0.1:$mport" --no-probe \
        --log-size "$LOG_SIZE" --read-cache-size 0 $SERVE_ARGS > "$work/serve.log" 2>&1 &
    lsvd_pid=$!
    url="http://127.0.0.1:$mport/metrics"
    wait_for 600 curl -sf --max-time 1 "$url"
    uri="nbd://127.0.0.1:$port/disk0"

    evictor "$work"/drive*/mnt/store &
    bg_pids="$bg_pids $!"
    sampler "$url" "$pre-samples.txt" "$lsvd_pid" &
    sampler_pid=$!
    bg_pids="$bg_pids $sampler_pid"

    # Written once in order, like Gecko's fill: on the chain, all of it on drive 0.
    echo "gecko-live: $layout: fill $VOLUME"
    fill_start="$(date +%s%3N)"
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 \
        --size="$VOLUME" --output="$work/fill.txt" > /dev/null
    wait_for 1800 drained "$url"
    fill_end="$(date +%s%3N)"

    echo "gecko-live: $layout: ${RUN_SECONDS} s of 4 KiB random writes"
    run_start="$(date +%s%3N)"
    # fio's bandwidth log skips the seconds in which no write completes (lsvd stalls
    # clients for seconds at a time once GC falls behind), so the MB/s over time come
    # from its cumulative bytes, printed every second (--status-interval).
    (cd "$work" && fio --name=randwrite --ioengine=nbd --uri="$uri" --rw=randwrite \
        --bs=4k --iodepth="$IODEPTH" --time_based --runtime="$RUN_SECONDS" \
        --randseed=1 --norandommap --write_bw_log=randwrite --log_avg_msec=1000 \
        --log_unix_epoch=1 --status-interval=1 --output-format=json \
        --output="$work/run.json" > /dev/null)
    run_end="$(date +%s%3N)"

    for p in $bg_pids; do stop_pid "$p" TERM; done
    bg_pids=""
    stop_pid "$lsvd_pid" INT
    wait "$lsvd_pid" || echo "gecko-live: $layout: lsvd serve exited with $?" >&2
    lsvd_pid=""

    cp "$work/randwrite_bw.1.log" "$pre-fio-bw.txt"
    python3 "$here/gecko-live-summary.py" --fio-json "$work/run.json" > "$pre-fio-bytes.txt"
    {
        echo "fill_start_ms $fill_start"
        echo "fill_end_ms $fill_end"
        echo "run_start_ms $run_start"
        echo "run_end_ms $run_end"
        echo "--- fio fill"
        grep -E 'WRITE:|write:' "$work/fill.txt" || true
        echo "--- fio randwrite: see $NAME-$layout-fio-bytes.txt"
        echo "--- lsvd serve warnings"
        grep -E 'WARN|ERROR' "$work/serve.log" | tail -20 || true
    } > "$pre-phases.txt"
    drives_down
}

mkdir -p "$OUT"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "lsvd: $("$LSVD" --version)"
    echo "fio: $(fio --version), nbdkit: $(nbdkit --version)"
    echo "kernel: $(uname -r), cpus: $(nproc)"
    echo "load before: $(cat /proc/loadavg)"
    echo "VOLUME=$VOLUME DRIVE_DEV=$DRIVE_DEV DRIVE_SIZE=$DRIVE_SIZE PIECE=$PIECE" \
        "PIECE_MS=$PIECE_MS LOG_SIZE=$LOG_SIZE RUN_SECONDS=$RUN_SECONDS IODEPTH=$IODEPTH"
    echo "SERVE_ARGS=$SERVE_ARGS"
} > "$OUT/$NAME-env.txt"

for layout in $LAYOUTS; do
    run_layout "$layout"
done
echo "load after: $(cat /proc/loadavg)" >> "$OUT/$NAME-env.txt"

# shellcheck disable=SC2086 # one argument per layout
python3 "$here/gecko-live-summary.py" --name "$NAME" "$OUT" $LAYOUTS | tee "$OUT/$NAME-summary.txt"

#!/usr/bin/env bash
# How long a volume is unavailable when its server stops, with a standby waiting
# (docs/SEMANTICS.md, "Several hosts, one volume"): two `lsvd serve` on one store from
# two data directories (two hosts), the holder stopped with SIGTERM (a clean stop:
# the standby takes over at once) or SIGKILL (a crash: the standby waits for the
# lease to lapse), timed from the signal until the standby answers NBD (nbdinfo).
#
#   bench/takeover.sh [RUNS] [LEASE]      # default 10 runs of each, --lease-timeout 2s
#   LSVD_BIN=path/to/lsvd bench/takeover.sh
#
# Prints each time and the medians; the SIGKILL median is also given as a ratio of the
# lease timeout (its floor: the standby must see no renewal for a whole timeout,
# counted from the last renewal it saw, so it lands between 2/3 of the timeout and
# the timeout after the kill, plus the claim and the recovery).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
lease=${2:-2s}
bash scripts/install-test-deps.sh >&2
if [[ -z "${LSVD_BIN:-}" ]]; then
    cargo build --release --locked -p lsvd >&2
    LSVD_BIN=target/release/lsvd
fi
work=$(mktemp -d /tmp/lsvd-takeover.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

now_ms() { date +%s%3N; }

# serve DATA SOCKET [ARGS...]: start lsvd serve in the background; prints its pid.
serve() {
    local data=$1 socket=$2
    shift 2
    "$LSVD_BIN" --data "$data" --store "file://$work/store" serve vol --socket "$socket" \
        --no-probe --log-size 64M --read-cache-size 16M --lease-timeout "$lease" "$@" \
        >>"$data.log" 2>&1 &
    echo $!
}

answers() { nbdinfo --size "nbd+unix:///vol?socket=$1" >/dev/null 2>&1; }

wait_answers() {
    local socket=$1 deadline=$(($(now_ms) + 120000))
    until answers "$socket"; do
        (($(now_ms) < deadline)) || { echo "no answer on $socket" >&2; exit 1; }
        sleep 0.01
    done
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

"$LSVD_BIN" --data "$work/a" --store "file://$work/store" create vol --size 1G >/dev/null
for sig in TERM KILL; do
    : >"$work/$sig.ms"
    for i in $(seq 1 "$runs"); do
        rm -rf "$work/a" "$work/b"
        a=$(serve "$work/a" "$work/a.sock"); pids+=("$a")
        wait_answers "$work/a.sock"
        b=$(serve "$work/b" "$work/b.sock" --standby); pids+=("$b")
        # Some writes, so the holder has something to upload at the stop.
        head -c 8M /dev/urandom | nbdcopy - "nbd+unix:///vol?socket=$work/a.sock"
        sleep 1
        t0=$(now_ms)
        kill -"$sig" "$a"
        wait_answers "$work/b.sock"
        t1=$(now_ms)
        echo $((t1 - t0)) | tee -a "$work/$sig.ms" | sed "s/^/SIG$sig run $i: takeover ms /"
        wait "$a" 2>/dev/null || true
        kill -TERM "$b"; wait "$b" 2>/dev/null || true
    done
done
term=$(median <"$work/TERM.ms")
kill=$(median <"$work/KILL.ms")
lease_ms=$(python3 -c "import re,sys; v,u=re.fullmatch(r'(\d+)(ms|s)', '$lease').groups(); print(int(v)*(1 if u=='ms' else 1000))")
echo "median of $runs: SIGTERM ${term} ms, SIGKILL ${kill} ms (lease timeout ${lease_ms} ms: ratio $(python3 -c "print(round($kill/$lease_ms, 2))"))"

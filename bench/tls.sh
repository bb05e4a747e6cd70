#!/usr/bin/env bash
# The cost of NBD over TLS: 4 KiB random write IOPS (fio's nbd engine, QD32) against
# one lsvd serving the same volume on loopback TCP, plain and TLS, alternating, three
# runs each; prints the medians and TLS/plain.
#
#   bench/tls.sh [--seconds N] [--lsvd PATH]
#
# Both listeners are TCP (a Unix socket would also remove the TCP stack from the
# baseline). The TLS listener has no client CA, and fio's libnbd skips verifying the
# server (tls-verify-peer=false): client certificates cost only at the handshake, which
# a long-lived NBD connection pays once. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=20
lsvd=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --seconds) seconds="$2"; shift 2 ;;
        --lsvd) lsvd="$2"; shift 2 ;;
        *) echo "usage: bench/tls.sh [--seconds N] [--lsvd PATH]" >&2; exit 2 ;;
    esac
done
if [[ -z "$lsvd" ]]; then
    cargo build --release --locked -p lsvd >/dev/null
    lsvd="${CARGO_TARGET_DIR:-target}/release/lsvd"
fi
for t in fio openssl; do
    command -v "$t" >/dev/null || { echo "bench/tls.sh: needs $t (scripts/install-test-deps.sh)" >&2; exit 2; }
done

work="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
    -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# One server per mode on its own data dir, so each gets the same fresh start.
serve() { # MODE PORT
    local mode="$1" port="$2" tls=()
    [[ "$mode" == tls ]] && tls=(--tls-cert "$work/cert.pem" --tls-key "$work/key.pem")
    "$lsvd" --data "$work/$mode" create bench --size 1G >/dev/null
    "$lsvd" --data "$work/$mode" serve bench --listen "127.0.0.1:$port" \
        --socket "$work/$mode.sock" --log-size 1G --read-cache-size 64M \
        "${tls[@]}" >"$work/$mode.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 300); do [[ -S "$work/$mode.sock" ]] && return; sleep 0.1; done
    echo "lsvd ($mode) did not start:" >&2; cat "$work/$mode.log" >&2; exit 1
}

plain_port="$(free_port)"; serve plain "$plain_port"
tls_port="$(free_port)"; serve tls "$tls_port"

run_fio() { # URI
    fio --name=randwrite --ioengine=nbd --uri="$1" --rw=randwrite --bs=4k --iodepth=32 \
        --size=1G --time_based --runtime="$seconds" --ramp_time=2 --randrepeat=0 \
        --output-format=json | python3 -c 'import json,sys; t=sys.stdin.read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["write"]["iops"]))'
}

plain=(); tls=()
for i in 1 2 3; do
    plain+=("$(run_fio "nbd://127.0.0.1:$plain_port/bench")")
    tls+=("$(run_fio "nbds://127.0.0.1:$tls_port/bench?tls-verify-peer=false")")
    echo "run $i: plain ${plain[-1]} IOPS, TLS ${tls[-1]} IOPS"
done
grep -q "refused\|failed" "$work/tls.log" && { echo "TLS server refused a client:" >&2; cat "$work/tls.log" >&2; exit 1; }
median() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
p="$(median "${plain[@]}")"; t="$(median "${tls[@]}")"
python3 -c "print(f'4 KiB random write QD32, median of 3: plain {$p} IOPS, TLS {$t} IOPS, TLS/plain {$t/$p:.2f}')"

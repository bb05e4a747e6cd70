#!/usr/bin/env bash
# CPU per request inside `lsvd serve`, split by thread: what issue 45's work is
# measured by (timings move with the machine; CPU per request much less).
#
#   bench/cpu.sh [--requests N] [--qd DEPTH] [--lsvd BIN] [-- SERVE_ARGS...]
#
# Serves a fresh 4 GiB volume, fills 1 GiB of it, then runs N (default 262144) 4 KiB
# random writes and then N 4 KiB random reads over that 1 GiB with fio (nbd engine,
# queue depth DEPTH, default 32). Around each phase it reads every thread's user and
# system CPU time from /proc/PID/task/*/stat; the write phase ends with `lsvd sync`, so
# the uploads of what it wrote count too. Prints CPU µs per request for the whole
# process (split into user and system time) and per thread group (nbd connection threads, the log writer, its I/O
# threads, the tokio runtime: uploads, GC, reads from objects), and fio's own CPU per
# request beside it (client and server share this machine's cores). This VM has no
# hardware counters (`perf stat -e instructions` is not supported): for instruction
# counts, which are the stable figure here, use bench/callgrind.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
requests=262144; qd=32; lsvd=target/release/lsvd; serve_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --requests) requests=$2; shift 2 ;;
        --qd) qd=$2; shift 2 ;;
        --lsvd) lsvd=$2; shift 2 ;;
        --) shift; serve_args=("$@"); break ;;
        *) echo "usage: $0 [--requests N] [--qd DEPTH] [--lsvd BIN] [-- SERVE_ARGS...]" >&2; exit 2 ;;
    esac
done
command -v fio >/dev/null || { echo "cpu.sh: needs fio (apt-get install fio)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/lsvd-cpu.XXXXXX)
pid=""
trap 'set +e; [ -n "$pid" ] && kill -INT $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
data=$tmp/data; sock=$tmp/nbd.sock
"$lsvd" --data "$data" create vol --size 4G >/dev/null
"$lsvd" --data "$data" serve vol --socket "$sock" --log-size 2G "${serve_args[@]}" 2>"$tmp/serve.log" &
pid=$!
for _ in $(seq 1 1800); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { echo "cpu.sh: the server did not start:" >&2; cat "$tmp/serve.log" >&2; exit 1; }
uri="nbd+unix:///vol?socket=$sock"
fio --name=fill --ioengine=nbd "--uri=$uri" --rw=write --bs=1M --iodepth=8 --size=1G \
    --refill_buffers --output=/dev/null
"$lsvd" --data "$data" sync vol >/dev/null

threads() { # -> "TID NAME TICKS" per thread of the server, and "all process TICKS"
    # (the process's own count includes threads that ended: a connection's thread
    # ends when its client disconnects)
    python3 - "/proc/$pid" <<'PY'
import sys
stat = open(sys.argv[1] + "/stat").read()
fields = stat[stat.rindex(")") + 2:].split()
print("all", "process", int(fields[11]) + int(fields[12]))
print("user", "process", int(fields[11]))
print("system", "process", int(fields[12]))
PY
    for t in /proc/$pid/task/*; do
        python3 - "$t" <<'PY' 2>/dev/null || true
import sys
t = sys.argv[1]
stat = open(t + "/stat").read()
name = stat[stat.index("(") + 1:stat.rindex(")")]
fields = stat[stat.rindex(")") + 2:].split()
print(t.rsplit("/", 1)[1], name.replace(" ", "_"), int(fields[11]) + int(fields[12]))
PY
    done
}

phase() { # NAME RW -> one line of results
    local name=$1 rw=$2
    threads >"$tmp/before"
    fio --name="$name" --ioengine=nbd "--uri=$uri" "--rw=$rw" --bs=4k "--iodepth=$qd" \
        --size=1G "--number_ios=$requests" --refill_buffers --randrepeat=0 \
        --output-format=json --output="$tmp/$name.json"
    [ "$rw" = randwrite ] && "$lsvd" --data "$data" sync vol >/dev/null
    threads >"$tmp/after"
    python3 - "$name" "$requests" "$(getconf CLK_TCK)" "$tmp/before" "$tmp/after" "$tmp/$name.json" <<'PY'
import json, sys
name, n, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(p):
    out = {}
    for line in open(p):
        tid, comm, ticks = line.split()
        out[tid] = (comm, int(ticks))
    return out
before, after = load(sys.argv[4]), load(sys.argv[5])
def group(comm):
    for prefix, g in (("nbd-connection", "nbd connections"), ("lsvd-log-io", "log I/O threads"),
                      ("lsvd-log", "log writer"), ("tokio-r", "tokio runtime (uploads, GC, object reads)")):
        if comm.startswith(prefix):
            return g
    return "other (" + comm + ")"
total = after["all"][1] - before["all"][1]
groups = {}
for tid, (comm, ticks) in after.items():
    if tid in ("all", "user", "system"):
        continue
    d = ticks - before.get(tid, (comm, 0))[1]
    groups[group(comm)] = groups.get(group(comm), 0) + d
groups["threads that ended (nbd connections)"] = total - sum(groups.values())
us = lambda ticks: ticks / hz * 1e6 / n
job = json.load(open(sys.argv[6]))["jobs"][0]
fio_us = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000 * 1e6 / n
iops = job["write" if "write" in name else "read"]["iops"]
user, system = (after[k][1] - before[k][1] for k in ("user", "system"))
print(f"{name}: {n} requests, {iops:,.0f} IOPS; lsvd {us(total):.2f} µs CPU per request "
      f"(user {us(user):.2f}, system {us(system):.2f}); fio {fio_us:.2f} µs")
for g, t in sorted(groups.items(), key=lambda kv: -kv[1]):
    if t:
        print(f"    {g:<44} {us(t):6.2f} µs")
PY
}
phase write-4k randwrite
phase read-4k randread

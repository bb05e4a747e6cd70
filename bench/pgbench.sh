#!/usr/bin/env bash
# PostgreSQL pgbench on ext4 on the disk under test: lsvd against qemu-nbd, in one run.
#
#   bench/pgbench.sh [--quick | --seconds N] [--rounds N] [--no-s3] [--targets LIST]
#                    [--scale N] [--clients N] [--threads N] [--connections N]
#                    [--lsvd PATH] [--dir PARENT] [--out DIR] [--serve-arg ARG ...]
#
# Targets (LIST, comma-separated; default all): qemu (qemu-nbd on a raw file: the
# reference), lsvd (local store), lsvd-s3 (lsvd on versitygw) and s3backer (on the same
# versitygw; its fsync is not durable). --no-s3 leaves the last two out. Each target is
# attached through nbdfuse and a loop device (s3backer's own FUSE file through the loop
# device), formatted ext4 and given a new PostgreSQL cluster; `pgbench -i -s SCALE`,
# then `pgbench -T` (60 s; --quick 20 s). Reports TPS, p50/p99/max latency and ratios
# to qemu-nbd in bench/results/pgbench.{md,json}. --rounds N repeats every target N
# times (order rotated) and reports medians. Default: scale 10, 8 clients, 2 threads.
#
# Needs root (losetup, mount; PostgreSQL itself runs as `postgres`). Installs PostgreSQL
# and s3backer (scripts/install-bench-deps.sh) and the NBD tools
# (scripts/install-test-deps.sh), builds lsvd in release mode unless --lsvd is given, and
# runs bench/pgbench.py, under scripts/with-versitygw.sh for the S3 targets. Everything
# lives in one scratch directory (under --dir, default /var/tmp); on any exit, failure
# or signal included, PostgreSQL servers, mounts, loop devices and processes left under
# it are removed, then the directory. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/bin:/usr/sbin:/bin:/sbin:${PATH}"

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

s3=1
lsvd=""
parent=/var/tmp
args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --no-s3) s3="" ;;
        --lsvd) lsvd="${2:?--lsvd needs a path}"; shift ;;
        --dir) parent="${2:?--dir needs a directory}"; shift ;;
        *) args+=("$1") ;;
    esac
    shift
done

if [[ "$(id -u)" -ne 0 ]]; then
    echo "bench/pgbench.sh: needs root (losetup, mount); PostgreSQL runs as the postgres user" >&2
    exit 2
fi

# nbdfuse, fuse3, qemu-nbd, e2fsprogs, mount and versitygw; PostgreSQL and s3backer.
bash scripts/install-test-deps.sh >/dev/null
if [[ -n "$s3" ]]; then
    bash scripts/install-bench-deps.sh postgres s3backer
else
    bash scripts/install-bench-deps.sh postgres
fi
if [[ -z "$lsvd" ]]; then
    cargo build --release --locked -p lsvd >/dev/null
    lsvd="${CARGO_TARGET_DIR:-target}/release/lsvd"
fi
lsvd="$(realpath "$lsvd")"

scratch="$(mktemp -d "$parent/lsvd-pgbench.XXXXXX")"
chmod 711 "$scratch" # the postgres user must reach its cluster and socket below it
child=""

# The driver undoes its own steps; this sweep catches whatever a crash or a kill of
# the driver left behind, innermost first. It only touches things under $scratch.
sweep() {
    local rc=$? f pid m dev back pgctl
    set +e # undo all that can be undone, whatever fails
    trap '' INT TERM HUP
    if [[ -n "$child" ]] && kill -0 "$child" 2>/dev/null; then
        [[ -s "$scratch/driver.pid" ]] && kill -TERM "$(cat "$scratch/driver.pid")" 2>/dev/null
        wait "$child" 2>/dev/null
    fi
    for f in "$scratch"/*/fs/pgdata/postmaster.pid; do
        [[ -f "$f" ]] || continue
        pgctl="$(compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' | sort -V | tail -n1)"
        runuser -u postgres -- "$pgctl" -D "$(dirname "$f")" -m immediate -w stop >/dev/null 2>&1 ||
            kill -KILL "$(head -n1 "$f")" 2>/dev/null
    done
    # ext4 mounts first (not FUSE), then the loop devices, then the FUSE mounts.
    while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m"
    done < <(awk -v p="$scratch/" 'index($2, p) == 1 && $3 !~ /^fuse/ {print $2}' /proc/mounts | sort -r)
    while read -r dev back; do
        [[ "$back" == "$scratch/"* ]] && losetup -d "$dev"
    done < <(losetup -n -l -O NAME,BACK-FILE 2>/dev/null)
    while read -r m; do
        fusermount3 -u "$m" 2>/dev/null || umount -l "$m"
    done < <(awk -v p="$scratch/" 'index($2, p) == 1 && $3 ~ /^fuse/ {print $2}' /proc/mounts | sort -r)
    # Servers and nbdfuse, by the pid they recorded, if that process is still ours.
    for f in "$scratch"/*/*.pid; do
        [[ -f "$f" ]] || continue
        pid="$(head -n1 "$f")"
        if [[ "$pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "$scratch/"; then
            kill -INT "$pid" 2>/dev/null
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null
        fi
    done
    if awk -v p="$scratch/" 'index($2, p) == 1 {found=1} END {exit !found}' /proc/mounts; then
        echo "bench/pgbench.sh: something is still mounted under $scratch; left in place" >&2
    else
        rm -rf "$scratch"
    fi
    exit "$rc"
}
trap sweep EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

cmd=(python3 bench/pgbench.py --lsvd "$lsvd" --scratch "$scratch")
if [[ -n "$s3" ]]; then
    cmd=(scripts/with-versitygw.sh "${cmd[@]}" --s3)
fi
# In the background so a signal to this script runs the trap at once (it forwards the
# signal to the driver, which tears down in order); ${args[@]+...} for bash < 4.4.
"${cmd[@]}" ${args[@]+"${args[@]}"} &
child=$!
wait "$child"

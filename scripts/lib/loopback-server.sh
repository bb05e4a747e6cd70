# Sourced by scripts/with-versitygw.sh, with-azurite.sh and with-fake-gcs.sh: what
# running a throwaway server on loopback for one command needs, written once.
#
#   loopback_server_init NAME KEEP_VAR ARGC
#                                        usage error (exit 2) if the script got no
#                                        command (ARGC is its $#); else the checkout in
#                                        $repo, a temp dir in $root, log path in $log,
#                                        $pid empty, and an EXIT trap that stops the
#                                        server and removes $root (kept, with a line
#                                        saying where, when the variable KEEP_VAR is 1)
#   hex N                                N random bytes as hex
#   port_free PORT                       true if nothing listens on 127.0.0.1:PORT
#   loopback_server_start TRIES START READY
#                                        on a free port ($port, up to 10 tried), run the
#                                        function START PORT in the background with its
#                                        output in $log ($pid; START must exec the server
#                                        so that $pid is the server), then ask the
#                                        function READY PORT every 0.1 s, TRIES times;
#                                        exits 1 showing the log if no port worked
#   loopback_server_run COMMAND...       run the command; on failure show the log's last
#                                        lines; exit with the command's status

hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

loopback_server_start() {
    local tries="$1" start="$2" ready="$3" started=""
    for _ in $(seq 10); do
        port=$((20000 + RANDOM % 40000))
        port_free "$port" || continue
        "$start" "$port" >"$log" 2>&1 &
        pid=$!
        for _ in $(seq "$tries"); do
            if ! kill -0 "$pid" 2>/dev/null; then
                break # exited: port taken after all, or a startup error
            fi
            if "$ready" "$port"; then
                started=1
                break
            fi
            sleep 0.1
        done
        [[ -n "$started" ]] && return 0
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        pid=""
    done
    echo "with-$_server_name: the server did not start; its log:" >&2
    cat "$log" >&2 || true
    exit 1
}

loopback_server_run() {
    local rc
    set +e
    "$@"
    rc=$?
    set -e
    if [[ $rc -ne 0 && -s "$log" ]]; then
        echo "with-$_server_name: command failed ($rc); last lines of the server log:" >&2
        tail -n 20 "$log" >&2 || true
    fi
    exit "$rc"
}

loopback_server_init() {
    if [[ "$3" -eq 0 ]]; then
        echo "usage: $0 COMMAND [ARGS...]" >&2
        exit 2
    fi
    _server_name="$1"
    _server_keep_var="$2"
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    root="$(mktemp -d "${TMPDIR:-/tmp}/lsvd-$_server_name.XXXXXX")"
    log="$root/server.log"
    pid=""
    trap _loopback_server_cleanup EXIT
    trap 'exit 130' INT TERM
}

_loopback_server_cleanup() {
    local rc=$?
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    if [[ "${!_server_keep_var:-}" == 1 ]]; then
        echo "with-$_server_name: kept $root (server log: $log)" >&2
    else
        rm -rf "$root"
    fi
    exit "$rc"
}

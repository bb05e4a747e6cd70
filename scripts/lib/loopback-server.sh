# Sourced by scripts/with-versitygw.sh, with-azurite.sh and with-fake-gcs.sh: what
# running a throwaway server on loopback for one command needs, written once.
#
#   loopback_server_init NAME KEEP_VAR   temp dir in $root, log path in $log, $pid
#                                        empty, and an EXIT trap that stops the
#                                        server and removes $root (kept, with a line
#                                        saying where, when the variable KEEP_VAR is 1)
#   hex N                                N random bytes as hex
#   port_free PORT                       true if nothing listens on 127.0.0.1:PORT

hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

loopback_server_init() {
    _server_name="$1"
    _server_keep_var="$2"
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

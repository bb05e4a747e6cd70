#!/usr/bin/env bash
# Installs the benchmark tools that scripts/install-test-deps.sh does not (Debian 12):
# PostgreSQL (the server and pgbench, Debian's `postgresql`) for bench/pgbench.sh, and
# s3backer for the S3 targets of bench/run.sh and bench/pgbench.sh.
#
#   scripts/install-bench-deps.sh            # both
#   scripts/install-bench-deps.sh postgres   # only PostgreSQL
#   scripts/install-bench-deps.sh s3backer   # only s3backer
#
# Idempotent: installs nothing if the tools are there; otherwise `apt-get update` once
# and `apt-get install -y --no-install-recommends` for what is missing (root or sudo).
# Debian's postgresql package creates and starts a `main` cluster on 127.0.0.1:5432 where
# an init system lets it; the benchmark does not use it (it runs its own cluster on the
# disk under test, on a Unix socket in its scratch directory).
set -euo pipefail

export PATH="/usr/bin:/usr/sbin:/bin:/sbin:${PATH}"

want=("$@")
[[ ${#want[@]} -gt 0 ]] || want=(postgres s3backer)

missing=()
for w in "${want[@]}"; do
    case "$w" in
        postgres)
            if ! compgen -G '/usr/lib/postgresql/*/bin/pgbench' >/dev/null ||
                ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
                missing+=(postgresql)
            fi
            command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
            ;;
        s3backer)
            command -v s3backer >/dev/null 2>&1 || missing+=(s3backer)
            ;;
        *)
            echo "install-bench-deps: unknown tool '$w' (postgres, s3backer)" >&2
            exit 2
            ;;
    esac
done

if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
sudo=()
[[ "$(id -u)" -eq 0 ]] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
echo "install-bench-deps: installing ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

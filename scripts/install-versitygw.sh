#!/usr/bin/env bash
# Install versitygw (an S3 server, Apache-2.0) into <repo>/.tools/bin, unless the
# pinned version is already there, and print the binary's path on stdout.
#
#   scripts/install-versitygw.sh            # -> /path/to/repo/.tools/bin/versitygw
#
# Needs Go (PATH, or /usr/local/go/bin/go) and the Go module proxy. The first
# install compiles versitygw: a few minutes on 2 cores. Progress goes to stderr.
# Override the location with LSVD_TOOLS_DIR, the Go binary with GO.
set -euo pipefail

VERSION="v1.8.0"
MODULE="github.com/versity/versitygw/cmd/versitygw"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="${LSVD_TOOLS_DIR:-$repo/.tools}"
bin_dir="$tools/bin"
bin="$bin_dir/versitygw"
stamp="$bin_dir/.versitygw-$VERSION"

if [[ -x "$bin" && -f "$stamp" ]]; then
    echo "$bin"
    exit 0
fi

go="${GO:-}"
if [[ -z "$go" ]]; then
    if command -v go >/dev/null 2>&1; then
        go="$(command -v go)"
    elif [[ -x /usr/local/go/bin/go ]]; then
        go=/usr/local/go/bin/go
    else
        echo "install-versitygw: Go is needed (https://go.dev/dl/, or apt-get install golang-go)" >&2
        exit 1
    fi
fi

mkdir -p "$bin_dir"
echo "install-versitygw: building versitygw $VERSION with $go (takes a few minutes the first time)" >&2
rm -f "$bin_dir"/.versitygw-*
GOBIN="$bin_dir" GOFLAGS="${GOFLAGS:-} -trimpath" "$go" install "$MODULE@$VERSION" >&2
if [[ ! -x "$bin" ]]; then
    echo "install-versitygw: go install finished but $bin is missing" >&2
    exit 1
fi
touch "$stamp"
echo "$bin"

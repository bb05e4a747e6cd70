#!/usr/bin/env bash
# Install versitygw (an S3 server, Apache-2.0) into <repo>/.tools/bin, unless the
# pinned version is already there, and print the binary's path on stdout.
#
#   scripts/install-versitygw.sh            # -> /path/to/repo/.tools/bin/versitygw
#
# Needs Go >= 1.21 (found, or installed into <repo>/.tools/go, by
# scripts/install-go.sh) and the Go module proxy. The first install compiles
# versitygw: a few minutes on 2 cores. Progress goes to stderr.
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

go="$("$repo/scripts/install-go.sh")"

mkdir -p "$bin_dir"
echo "install-versitygw: building versitygw $VERSION with $go (takes a few minutes the first time)" >&2
rm -f "$bin_dir"/.versitygw-*
# GOTOOLCHAIN=auto: a Go older than versitygw's go.mod asks for fetches that
# toolchain through the module proxy (some installations default to `local`).
GOTOOLCHAIN=auto GOBIN="$bin_dir" GOFLAGS="${GOFLAGS:-} -trimpath" \
    "$go" install "$MODULE@$VERSION" >&2
if [[ ! -x "$bin" ]]; then
    echo "install-versitygw: go install finished but $bin is missing" >&2
    exit 1
fi
touch "$stamp"
echo "$bin"

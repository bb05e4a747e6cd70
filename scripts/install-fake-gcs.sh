#!/usr/bin/env bash
# Install fake-gcs-server (a Google Cloud Storage emulator, BSD-2-Clause) into
# <repo>/.tools/bin, unless the pinned version is already there, and print the
# binary's path on stdout.
#
#   scripts/install-fake-gcs.sh            # -> /path/to/repo/.tools/bin/fake-gcs-server
#
# Needs Go >= 1.21 (found, or installed into <repo>/.tools/go, by
# scripts/install-go.sh) and the Go module proxy: fake-gcs-server's go.mod asks for
# Go 1.26, which GOTOOLCHAIN=auto fetches through the proxy if the Go found is older.
# The first install compiles it: a minute or two on 2 cores. Progress goes to stderr.
# Override the location with LSVD_TOOLS_DIR, the Go binary with GO.
set -euo pipefail

VERSION="v1.56.1"
MODULE="github.com/fsouza/fake-gcs-server"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="${LSVD_TOOLS_DIR:-$repo/.tools}"
bin_dir="$tools/bin"
bin="$bin_dir/fake-gcs-server"
stamp="$bin_dir/.fake-gcs-server-$VERSION"

if [[ -x "$bin" && -f "$stamp" ]]; then
    echo "$bin"
    exit 0
fi

go="$("$repo/scripts/install-go.sh")"

mkdir -p "$bin_dir"
echo "install-fake-gcs: building fake-gcs-server $VERSION with $go (takes a minute or two the first time)" >&2
rm -f "$bin_dir"/.fake-gcs-server-*
GOTOOLCHAIN=auto GOBIN="$bin_dir" GOFLAGS="${GOFLAGS:-} -trimpath" \
    "$go" install "$MODULE@$VERSION" >&2
if [[ ! -x "$bin" ]]; then
    echo "install-fake-gcs: go install finished but $bin is missing" >&2
    exit 1
fi
touch "$stamp"
echo "$bin"

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

# shellcheck source=lib/install.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/install.sh"
go_install_tool install-versitygw versitygw v1.8.0 github.com/versity/versitygw/cmd/versitygw \
    "takes a few minutes the first time"

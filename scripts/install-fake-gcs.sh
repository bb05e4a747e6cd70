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

# shellcheck source=lib/install.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/install.sh"
go_install_tool install-fake-gcs fake-gcs-server v1.56.1 github.com/fsouza/fake-gcs-server \
    "takes a minute or two the first time"

#!/usr/bin/env bash
# The GCS and Azure pass of the test suite (scripts/test.sh runs it after the S3 pass):
# crates/lsvd/tests/cloud_stores.rs against each emulator on loopback,
#
#   az_  Azurite (scripts/with-azurite.sh): the az:// store, put-if-absent races, the
#        self-test, and `lsvd serve` from Azurite surviving SIGKILL and a lost data dir;
#        then the end-to-end tests cli, nbd_clients and persistence with every volume
#        in the Azurite container (LSVD_TEST_STORE=az, crates/lsvd/tests/common/mod.rs)
#   gs_  fake-gcs-server (scripts/with-fake-gcs.sh): the self-test refuses it (no
#        XML-API upload, see README.md), reads and lists of seeded objects
#
#   scripts/test-cloud.sh
#
# LSVD_REQUIRE_CLOUD makes a missing emulator a failure, not a skip. Installs the
# emulators on first use (scripts/install-test-deps.sh does it up front).
set -euo pipefail
cd "$(dirname "$0")/.."

export LSVD_REQUIRE_CLOUD=az,gs
e2e=(--test cli --test nbd_clients --test persistence)
# Built once, outside the emulators' lifetime.
cargo test -p lsvd --locked --test cloud_stores "${e2e[@]}" --no-run
start=$SECONDS
scripts/with-azurite.sh bash -c '
    set -e
    cargo test -p lsvd --locked --test cloud_stores az_
    LSVD_TEST_STORE=az cargo test -p lsvd --locked "$@"' test-cloud "${e2e[@]}"
echo "test-cloud: the Azure (Azurite) pass took $((SECONDS - start)) s" >&2
start=$SECONDS
scripts/with-fake-gcs.sh cargo test -p lsvd --locked --test cloud_stores gs_
echo "test-cloud: the GCS (fake-gcs-server) pass took $((SECONDS - start)) s" >&2

#!/usr/bin/env bash
# Run a command against a throwaway Google Cloud Storage emulator (fake-gcs-server) on
# loopback.
#
#   scripts/with-fake-gcs.sh cargo test -p lsvd --test cloud_stores
#
# Installs fake-gcs-server if needed (scripts/install-fake-gcs.sh), starts it on a free
# 127.0.0.1 port (plain HTTP, in-memory backend), creates a bucket, exports
#
#   GOOGLE_SERVICE_ACCOUNT_KEY   a key with "disable_oauth": true and "gcs_base_url"
#   LSVD_TEST_GS_BUCKET          the bucket
#   LSVD_TEST_GS_BASE_URL        http://127.0.0.1:PORT (for seeding through the JSON API)
#
# so that gs://BUCKET/PREFIX opens the emulator, runs the command, then stops the
# server (its log is kept with LSVD_KEEP_FAKE_GCS=1). Exits with the command's status.
#
# Note: fake-gcs-server has no XML-API object upload (PUT /BUCKET/KEY answers 400
# "invalid uploadType"), which is how object_store writes; see README.md.
set -euo pipefail

# shellcheck source=lib/loopback-server.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/loopback-server.sh"
loopback_server_init fake-gcs LSVD_KEEP_FAKE_GCS $#
server="$("$repo/scripts/install-fake-gcs.sh")"

bucket="lsvd-test-$(hex 4)"

start_fake_gcs() {
    exec "$server" -scheme http -host 127.0.0.1 -port "$1" -backend memory \
        -public-host "127.0.0.1:$1" -log-level warn
}
fake_gcs_ready() { curl -s -o /dev/null --fail --max-time 1 "http://127.0.0.1:$1/storage/v1/b"; }
loopback_server_start 100 start_fake_gcs fake_gcs_ready

base="http://127.0.0.1:$port"
if ! curl -sS --fail --max-time 10 -X POST -H 'Content-Type: application/json' \
    -d "{\"name\":\"$bucket\"}" "$base/storage/v1/b" >/dev/null; then
    echo "with-fake-gcs: cannot create bucket $bucket; server log:" >&2
    cat "$log" >&2 || true
    exit 1
fi

echo "with-fake-gcs: $server on $base, bucket $bucket" >&2

unset GOOGLE_SERVICE_ACCOUNT GOOGLE_SERVICE_ACCOUNT_PATH GOOGLE_APPLICATION_CREDENTIALS \
    GOOGLE_BEARER_TOKEN GOOGLE_BASE_URL
export GOOGLE_SERVICE_ACCOUNT_KEY="{\"private_key\":\"\",\"private_key_id\":\"\",\"client_email\":\"\",\"disable_oauth\":true,\"gcs_base_url\":\"$base\"}"
export LSVD_TEST_GS_BUCKET="$bucket"
export LSVD_TEST_GS_BASE_URL="$base"

loopback_server_run "$@"

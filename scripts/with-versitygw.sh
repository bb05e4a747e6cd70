#!/usr/bin/env bash
# Run a command against a throwaway S3 server (versitygw) on loopback.
#
#   scripts/with-versitygw.sh cargo test -p lsvd --test s3_store
#
# Installs versitygw if needed (scripts/install-versitygw.sh), starts it on a free
# 127.0.0.1 port with a temporary root directory and random credentials, creates a
# bucket, exports
#
#   AWS_ENDPOINT_URL  AWS_ACCESS_KEY_ID  AWS_SECRET_ACCESS_KEY  AWS_REGION
#   AWS_DEFAULT_REGION  LSVD_TEST_S3_BUCKET
#
# runs the command, then stops the server and removes its directory (kept, with the
# server log, when LSVD_KEEP_VERSITYGW=1). Exits with the command's status.
set -euo pipefail

# shellcheck source=lib/loopback-server.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/loopback-server.sh"
loopback_server_init versitygw LSVD_KEEP_VERSITYGW $#
gw="$("$repo/scripts/install-versitygw.sh")"

mkdir -p "$root/data"

access="lsvd$(hex 8)"
secret="$(hex 20)"
bucket="lsvd-test-$(hex 4)"

start_versitygw() {
    ROOT_ACCESS_KEY="$access" ROOT_SECRET_KEY="$secret" \
        exec "$gw" --port "127.0.0.1:$1" posix "$root/data"
}
versitygw_ready() { curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$1/"; }
loopback_server_start 100 start_versitygw versitygw_ready

endpoint="http://127.0.0.1:$port"
# CreateBucket, signed by curl (SigV4; versitygw wants the payload hash header).
empty_sha256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
if ! curl -sS --fail --max-time 10 -X PUT --aws-sigv4 "aws:amz:us-east-1:s3" \
    --user "$access:$secret" -H "x-amz-content-sha256: $empty_sha256" \
    "$endpoint/$bucket" >/dev/null; then
    echo "with-versitygw: cannot create bucket $bucket; server log:" >&2
    cat "$log" >&2 || true
    exit 1
fi

echo "with-versitygw: $gw on $endpoint, bucket $bucket" >&2

unset AWS_SESSION_TOKEN AWS_PROFILE AWS_ENDPOINT AWS_ENDPOINT_URL_S3 AWS_VIRTUAL_HOSTED_STYLE_REQUEST
export AWS_ENDPOINT_URL="$endpoint"
export AWS_ACCESS_KEY_ID="$access"
export AWS_SECRET_ACCESS_KEY="$secret"
export AWS_REGION="us-east-1"
export AWS_DEFAULT_REGION="us-east-1"
export LSVD_TEST_S3_BUCKET="$bucket"

loopback_server_run "$@"

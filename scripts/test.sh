#!/usr/bin/env bash
# The project's test entry point: install the test tools, run every test once, then
# run the end-to-end tests again against a real S3 server (scripts/test-s3.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
start=$SECONDS
cargo test --workspace --locked
echo "test: cargo test --workspace took $((SECONDS - start)) s" >&2
bash scripts/test-s3.sh

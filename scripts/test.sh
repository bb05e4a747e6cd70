#!/usr/bin/env bash
# The project's test entry point: install the test tools, check formatting and lints,
# run every test once, then run the end-to-end tests again against a real S3 server
# (scripts/test-s3.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
start=$SECONDS
cargo fmt --all --check
# Every lint, including the workspace's `unwrap_used = "deny"`, on tests too.
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "test: fmt and clippy took $((SECONDS - start)) s" >&2
start=$SECONDS
# The fault soak (crates/lsvd/tests/soak.rs, docs/soak.md) runs here, once, with its
# own versitygw: required, not skipped, since install-test-deps.sh built it.
LSVD_SOAK_REQUIRE=1 cargo test --workspace --locked
echo "test: cargo test --workspace took $((SECONDS - start)) s" >&2
bash scripts/test-s3.sh

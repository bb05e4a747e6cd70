#!/usr/bin/env bash
# The project's test entry point: install the test tools, check formatting and lints,
# run every test once (the crash oracle's process and power-loss kinds twice, the
# second time on a mirrored chain store, and its process kinds on an encrypted,
# compressed volume), fuzz every parser briefly (scripts/fuzz.sh),
# then run the end-to-end tests again against a real S3 server (scripts/test-s3.sh),
# and the GCS and Azure stores against their emulators (scripts/test-cloud.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
start=$SECONDS
cargo fmt --all --check
# Every lint, including the workspace's `unwrap_used = "deny"`, on tests too.
cargo clippy --workspace --all-targets --locked -- -D warnings
# The fuzz targets are a package outside the workspace (fuzz/Cargo.toml says why).
cargo fmt --manifest-path fuzz/Cargo.toml --check
(cd fuzz && cargo clippy --all-targets --locked --target-dir ../target/fuzz-lint -- -D warnings)
echo "test: fmt and clippy took $((SECONDS - start)) s" >&2
start=$SECONDS
# The fault soak (crates/lsvd/tests/soak.rs, docs/soak.md) runs here, once, with its
# own versitygw: required, not skipped, since install-test-deps.sh built it.
LSVD_SOAK_REQUIRE=1 cargo test --workspace --locked
echo "test: cargo test --workspace took $((SECONDS - start)) s" >&2
# The crash oracle's process and power-loss kinds again with every volume on a
# mirrored chain of three small drives (`chain:` store, LSVD_TEST_STORE=chain).
start=$SECONDS
LSVD_TEST_STORE=chain LSVD_ORACLE_POINTS=20 \
    cargo test -p lsvd --locked --test crash_oracle -- process_ power_loss
echo "test: the chain-store oracle pass took $((SECONDS - start)) s" >&2
# The process and takeover kinds again on an encrypted, lz4-compressed volume (short).
start=$SECONDS
LSVD_ORACLE_ENCRYPT=1 LSVD_ORACLE_COMPRESSION=lz4 LSVD_ORACLE_POINTS=10 \
    cargo test -p lsvd --locked --test crash_oracle -- process_ takeover_sigkill
echo "test: the encrypted, compressed oracle pass took $((SECONDS - start)) s" >&2
# Coverage-guided fuzzing, short: every target for a few seconds from its seed corpus
# (docs/fuzzing.md; the long run is `scripts/fuzz.sh --long`).
start=$SECONDS
bash scripts/fuzz.sh
echo "test: short fuzz run took $((SECONDS - start)) s" >&2
bash scripts/test-s3.sh
bash scripts/test-cloud.sh

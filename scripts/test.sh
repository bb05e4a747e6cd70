#!/usr/bin/env bash
# The project's test entry point: install the test tools, check formatting and lints,
# run every test once (`cargo test --workspace`), then, side by side: the crash
# oracle's process and power-loss kinds on a mirrored chain store and its process
# kinds on an encrypted, compressed volume, the end-to-end tests against a real S3
# server (scripts/test-s3.sh), the GCS and Azure stores against their emulators
# (scripts/test-cloud.sh), and a short fuzz run of every parser (scripts/fuzz.sh).
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
logs=target/ci-logs
rm -rf "$logs"
mkdir -p "$logs"
# The fuzz targets' instrumented release build (scripts/fuzz.sh, minutes of CPU) starts
# now at the lowest CPU priority: it takes the CPU the workspace's tests leave idle
# while they wait on processes, leases and timers, instead of running after them. The
# fuzz pass below finds it built (or waits for cargo's lock on target/fuzz).
# In a process group of its own (setsid), so that a failure before the fuzz pass stops
# the whole build (cargo, rustc) instead of leaving it running.
setsid nice -n 19 bash scripts/fuzz.sh --build-only >"$logs/fuzz-build.log" 2>&1 &
fuzz_build=$!
trap 'kill -TERM -- "-$fuzz_build" 2>/dev/null || true' EXIT
start=$SECONDS
# The fault soak (crates/lsvd/tests/soak.rs, docs/soak.md) runs here, once, with its
# own versitygw: required, not skipped, since install-test-deps.sh built it.
LSVD_SOAK_REQUIRE=1 cargo test --workspace --locked
echo "test: cargo test --workspace took $((SECONDS - start)) s" >&2
# The passes after it mostly wait on processes (servers killed and restarted, leases
# lapsing, emulators answering), so they run side by side, each into its own log,
# printed whole when it ends: the oracle's kinds on other stores, the S3 pass, the
# cloud emulators, and the short fuzz run (its build is the one CPU-heavy part).
names=()
pids=()
side() {
    local name=$1
    shift
    "$@" >"$logs/$name.log" 2>&1 &
    pids+=($!)
    names+=("$name")
}
oracle_passes() {
    local start=$SECONDS
    # The crash oracle's process and power-loss kinds again with every volume on a
    # mirrored chain of three small drives (`chain:` store, LSVD_TEST_STORE=chain).
    LSVD_TEST_STORE=chain LSVD_ORACLE_POINTS=20 \
        cargo test -p lsvd --locked --test crash_oracle -- process_ power_loss
    echo "test: the chain-store oracle pass took $((SECONDS - start)) s" >&2
    # The process and takeover kinds again on an encrypted, lz4-compressed volume.
    start=$SECONDS
    LSVD_ORACLE_ENCRYPT=1 LSVD_ORACLE_COMPRESSION=lz4 LSVD_ORACLE_POINTS=10 \
        cargo test -p lsvd --locked --test crash_oracle -- process_ takeover_sigkill
    echo "test: the encrypted, compressed oracle pass took $((SECONDS - start)) s" >&2
}
start=$SECONDS
side oracle oracle_passes
side s3 bash scripts/test-s3.sh
side cloud bash scripts/test-cloud.sh
# Coverage-guided fuzzing, short: every target for a few seconds from its seed corpus
# (docs/fuzzing.md; the long run is `scripts/fuzz.sh --long`).
fuzz_pass() {
    local status=0
    bash scripts/fuzz.sh || status=$?
    echo "fuzz: the early, low-priority build's log:"
    cat "$logs/fuzz-build.log"
    return "$status"
}
side fuzz fuzz_pass
failed=()
for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then
        status=passed
    else
        status=FAILED
        failed+=("${names[$i]}")
    fi
    echo "==== test: the ${names[$i]} pass $status; its log ($logs/${names[$i]}.log):" >&2
    cat "$logs/${names[$i]}.log" >&2
done
echo "test: the side-by-side passes took $((SECONDS - start)) s" >&2
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "test: FAILED: ${failed[*]}" >&2
    exit 1
fi

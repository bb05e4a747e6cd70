#!/usr/bin/env bash
# The project's test entry point: install the test tools, then run every test once.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
cargo test --workspace --locked

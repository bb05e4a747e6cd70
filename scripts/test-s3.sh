#!/usr/bin/env bash
# The S3 pass of the test suite (scripts/test.sh runs it after `cargo test`): the
# end-to-end tests again, with every volume in a bucket of a throwaway versitygw on
# loopback instead of a local directory (LSVD_TEST_STORE=s3, see
# crates/lsvd/tests/common/mod.rs):
#
#   s3_store      the S3 store itself (fails, not skips, without a server here)
#   store_faults  a wrong secret is Denied at once; versitygw on a full tmpfs is Full
#                 (root only), the local store and a mirror on a full tmpfs
#   cli, nbd_clients, persistence, ext4
#                 real clients, restarts, SIGKILL, rebuild from the store, GC
#   integrity     a record corrupted on the cache device is refused and reported
#   probe_settings  `lsvd probe --store` against versitygw (tiny, --quick), and the
#                 profiles driving serve and info
#   replicate     `lsvd replicate --follow` killed at seeded points (prefixes), a full
#                 copy serving the source's bytes (source and replica both in S3)
#   shared_read_cache  a clone and a snapshot export read what their base cached, with
#                 no GET (one read cache per serve)
#   crash_oracle  the process-level kinds (process_sigkill, process_cache_deleted),
#                 LSVD_S3_ORACLE_POINTS crash points each (default 20)
#
#   scripts/test-s3.sh
#
# Not the soak (crates/lsvd/tests/soak.rs): it runs in `cargo test --workspace` with a
# versitygw of its own, which it kills and restarts.
#
# Starts versitygw through scripts/with-versitygw.sh (which builds it with Go the first
# time; scripts/install-test-deps.sh installs what that needs).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${_LSVD_S3_PASS_SERVER:-}" != 1 ]]; then
    export _LSVD_S3_PASS_SERVER=1
    exec scripts/with-versitygw.sh "$0"
fi

start=$SECONDS
export LSVD_TEST_STORE=s3
cargo test -p lsvd --locked \
    --test s3_store --test store_faults --test cli --test nbd_clients --test persistence --test ext4 \
    --test integrity --test probe_settings --test replicate --test compression --test encryption --test image --test diff --test dirty_bitmaps \
    --test shared_read_cache
LSVD_ORACLE_POINTS="${LSVD_S3_ORACLE_POINTS:-20}" \
    cargo test -p lsvd --locked --test crash_oracle process_
echo "test-s3: the S3 pass took $((SECONDS - start)) s" >&2

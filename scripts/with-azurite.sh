#!/usr/bin/env bash
# Run a command against a throwaway Azure Blob Storage emulator (Azurite) on loopback.
#
#   scripts/with-azurite.sh cargo test -p lsvd --test cloud_stores
#
# Installs Azurite if needed (scripts/install-azurite.sh), starts azurite-blob on a
# free 127.0.0.1 port with in-memory storage (telemetry off), creates a container
# (a Create Container request signed with the emulator's well-known shared key), exports
#
#   AZURE_STORAGE_USE_EMULATOR=true  AZURITE_BLOB_STORAGE_URL=http://127.0.0.1:PORT
#   LSVD_TEST_AZ_CONTAINER=CONTAINER
#
# so that az://CONTAINER/PREFIX opens the emulator, runs the command, then stops the
# server and removes its directory (kept, with the server log, when
# LSVD_KEEP_AZURITE=1). Exits with the command's status.
set -euo pipefail

# shellcheck source=lib/loopback-server.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/loopback-server.sh"
loopback_server_init azurite LSVD_KEEP_AZURITE $#
azurite="$("$repo/scripts/install-azurite.sh")"

# The emulator's documented development account (public, not a secret).
account="devstoreaccount1"
account_key="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

container="lsvd-test-$(hex 4)"

start_azurite() {
    # exec: $pid is node itself, so stopping it stops the server.
    cd "$root" && exec "$azurite" --blobHost 127.0.0.1 --blobPort "$1" \
        --inMemoryPersistence --extentMemoryLimit 4096 --disableTelemetry --skipApiVersionCheck --loose
}
azurite_ready() { grep -q "successfully listens" "$log" 2>/dev/null; }
loopback_server_start 150 start_azurite azurite_ready

endpoint="http://127.0.0.1:$port/$account"
# Create Container, signed with Shared Key (string to sign: the verb, eleven empty
# standard headers, the x-ms-* headers, the canonical resource).
version="2021-08-06"
date="$(LC_ALL=C TZ=GMT date '+%a, %d %b %Y %H:%M:%S GMT')"
string_to_sign="$(printf 'PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:%s\nx-ms-version:%s\n/%s/%s/%s\nrestype:container' \
    "$date" "$version" "$account" "$account" "$container")"
signature="$(printf '%s' "$string_to_sign" |
    openssl dgst -sha256 -mac HMAC -macopt "hexkey:$(printf '%s' "$account_key" | base64 -d | od -An -v -tx1 | tr -d ' \n')" -binary |
    base64)"
if ! curl -sS --fail-with-body --max-time 10 -X PUT -H "Content-Length: 0" \
    -H "x-ms-date: $date" -H "x-ms-version: $version" \
    -H "Authorization: SharedKey $account:$signature" \
    "$endpoint/$container?restype=container" >"$root/create.out" 2>&1; then
    echo "with-azurite: cannot create container $container:" >&2
    cat "$root/create.out" >&2 || true
    tail -n 20 "$log" >&2 || true
    exit 1
fi

echo "with-azurite: $azurite on http://127.0.0.1:$port, container $container" >&2

unset AZURE_STORAGE_ACCOUNT_KEY AZURE_STORAGE_ACCESS_KEY AZURE_STORAGE_SAS_KEY AZURE_STORAGE_TOKEN \
    AZURE_STORAGE_ENDPOINT AZURE_ENDPOINT AZURE_STORAGE_ACCOUNT_NAME
export AZURE_STORAGE_USE_EMULATOR=true
export AZURITE_BLOB_STORAGE_URL="http://127.0.0.1:$port"
export LSVD_TEST_AZ_CONTAINER="$container"

loopback_server_run "$@"

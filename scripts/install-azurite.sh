#!/usr/bin/env bash
# Install Azurite (Microsoft's Azure Storage emulator, MIT) from the npm registry into
# <repo>/.tools/azurite, unless the pinned version is already there, and print the
# path of its `azurite-blob` launcher on stdout.
#
#   scripts/install-azurite.sh         # -> /path/to/repo/.tools/azurite/node_modules/.bin/azurite-blob
#
# Needs Node.js and npm (installed with apt-get if missing). Azurite 3.35.0 is the last
# release that runs on Node 20 (3.36 asks for Node >= 21); the machine's Node is 20.
# The first install takes under a minute. Progress goes to stderr.
# Override the location with LSVD_TOOLS_DIR.
set -euo pipefail

VERSION="3.35.0"

# shellcheck source=lib/install.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/install.sh"
dir="$tools/azurite"
bin="$dir/node_modules/.bin/azurite-blob"
stamp="$dir/.azurite-$VERSION"
print_if_installed "$bin" "$stamp"

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    echo "install-azurite: no node/npm; installing Debian's nodejs and npm" >&2
    apt_install install-azurite nodejs npm
fi

echo "install-azurite: installing azurite $VERSION with npm into $dir" >&2
rm -rf "$dir.new"
mkdir -p "$dir.new"
printf '{ "name": "lsvd-azurite", "private": true }\n' >"$dir.new/package.json"
npm install --prefix "$dir.new" --no-audit --no-fund --omit=dev --save-exact \
    "azurite@$VERSION" >&2
if [[ ! -x "$dir.new/node_modules/.bin/azurite-blob" ]]; then
    echo "install-azurite: npm install finished but azurite-blob is missing" >&2
    exit 1
fi
rm -rf "$dir"
mv "$dir.new" "$dir"
touch "$stamp"
echo "$bin"

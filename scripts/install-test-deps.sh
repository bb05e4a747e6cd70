#!/usr/bin/env bash
# Installs the real clients and tools the lsvd integration tests drive (Debian 12),
# versitygw, the S3 server of the S3 pass (scripts/test-s3.sh), and the GCS and Azure
# emulators of the cloud pass (scripts/test-cloud.sh): fake-gcs-server and Azurite.
#
# Idempotent: if every needed command is already there it installs nothing. Otherwise it
# runs `apt-get update` once and `apt-get install -y` for the missing packages, and says
# what it installed. Needs root (or sudo) only when something is missing.
#
# versitygw is built from source by scripts/install-versitygw.sh into .tools/bin
# (once; later runs find it there). That needs Go >= 1.21 (scripts/install-go.sh finds
# one, or installs Go 1.25.0 into .tools/go through the Go module proxy, bootstrapped
# from Debian's golang-go) and curl (with-versitygw.sh creates the bucket with it).
# fake-gcs-server is built the same way (scripts/install-fake-gcs.sh); Azurite comes
# from the npm registry into .tools/azurite (scripts/install-azurite.sh, with the
# machine's Node.js and npm). Each is skipped when its pinned version is there.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# System tools live in /usr/sbin; /usr/bin first so a pyenv python3 cannot hide the
# Debian one that has the libnbd module.
export PATH="/usr/bin:/usr/sbin:/bin:/sbin:${PATH}"

# command -> Debian package that provides it
declare -A PACKAGE_OF=(
    [nbdinfo]=libnbd-bin
    [nbdcopy]=libnbd-bin
    [nbdfuse]=libnbd-bin
    [nbdsh]=python3-libnbd
    [qemu-io]=qemu-utils
    [qemu-img]=qemu-utils
    [qemu-nbd]=qemu-utils
    [fio]=fio
    [nbdkit]=nbdkit
    [fusermount3]=fuse3
    [mkfs.ext4]=e2fsprogs
    [e2fsck]=e2fsprogs
    [losetup]=mount
    [mount]=mount
    [umount]=mount
    [sha256sum]=coreutils
    [sync]=coreutils
    [curl]=curl
    [openssl]=openssl
)

declare -A missing=()
for cmd in "${!PACKAGE_OF[@]}"; do
    if ! command -v "$cmd" >/dev/null 2>&1; then
        missing[${PACKAGE_OF[$cmd]}]=1
    fi
done
# nbdsh is a wrapper around the Python module; check the module itself too.
if ! /usr/bin/python3 -c 'import nbd' >/dev/null 2>&1; then
    missing[python3-libnbd]=1
fi
# The memory plugin is what the tests compare against.
if command -v nbdkit >/dev/null 2>&1 && ! nbdkit memory --dump-plugin >/dev/null 2>&1; then
    missing[nbdkit]=1
fi

# --- VM crash test (crates/lsvd/tests/vm_crash.rs, scripts/vm/build-assets.sh) -------
# qemu, a Debian cloud kernel for the guest, a static busybox and cpio to build its
# initramfs (e2fsprogs is above).
vm_missing() {
    command -v qemu-system-x86_64 > /dev/null 2>&1 || echo qemu-system-x86
    compgen -G '/boot/vmlinuz-*-cloud-amd64' > /dev/null || echo linux-image-cloud-amd64
    dpkg-query -W -f='${Status}' busybox-static 2> /dev/null | grep -q 'ok installed' ||
        echo busybox-static
    command -v cpio > /dev/null 2>&1 || echo cpio
}
for p in $(vm_missing); do
    missing[$p]=1
done
# --- end of the VM crash test block -----------------------------------------------

install_versitygw() {
    local gw gcs az
    gw="$("$repo/scripts/install-versitygw.sh")"
    echo "install-test-deps: versitygw at $gw"
    gcs="$("$repo/scripts/install-fake-gcs.sh")"
    echo "install-test-deps: fake-gcs-server at $gcs"
    az="$("$repo/scripts/install-azurite.sh")"
    echo "install-test-deps: azurite-blob at $az"
}

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-test-deps: all test tools present, nothing to install"
    install_versitygw
    exit 0
fi

packages=$(printf '%s\n' "${!missing[@]}" | sort | paste -sd ' ')
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
else
    echo "install-test-deps: need root to install: ${packages}" >&2
    exit 1
fi

echo "install-test-deps: installing ${packages}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
# shellcheck disable=SC2086 # word splitting of the package list is intended
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends ${packages}

# Verify, so a missing tool fails here and not halfway through the tests.
still=()
for cmd in "${!PACKAGE_OF[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || still+=("$cmd")
done
/usr/bin/python3 -c 'import nbd' >/dev/null 2>&1 || still+=("python3 module nbd")
for p in $(vm_missing); do still+=("$p (VM crash test)"); done
if [ "${#still[@]}" -ne 0 ]; then
    echo "install-test-deps: still missing after install: ${still[*]}" >&2
    exit 1
fi
echo "install-test-deps: installed ${packages}"
install_versitygw
